"""The model's chat template with an episode's tools and the run's template kwargs.

Both the miles adapter and `t2sql eval --api sglang` turn messages into token ids through it, one
turn at a time.
"""

from __future__ import annotations

from typing import Any

from t2sql.errors import AdapterError

# Qwen's end-of-turn token: the fallback when the chat template does not show one. Never taken from
# the tokenizer's eos_token, which may be "<|endoftext|>" (transformers' default for Qwen3.5's class).
END_OF_TURN = "<|im_end|>"
_PROBE = "t2sql-end-of-turn-probe"


def count_tokens(tokenizer: Any, text: str) -> int:
    """The model's tokens in a text, as the episode's metrics count them (think and visible tokens):
    the text's own ids, no special tokens added."""
    return len(tokenizer.encode(text, add_special_tokens=False))


class ChatTemplate:
    """The chat template with the episode's tools and the run's template kwargs, every time."""

    def __init__(self, tokenizer: Any, tools: list[dict], template_kwargs: dict | None):
        self.tokenizer = tokenizer
        self.tools = tools
        self.kwargs = dict(template_kwargs or {})
        self._end_of_turn: str | None = None

    def text(self, messages: list[dict], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=generation_prompt, tokenize=False, **self.kwargs
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def end_of_turn(self) -> str:
        """The token the template writes right after an assistant message's text (Qwen: <|im_end|>),
        read from the template itself: render a probe assistant message and take what follows it up
        to the first whitespace. END_OF_TURN when the template writes nothing recognisable there."""
        if self._end_of_turn is None:
            probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}]
            try:
                text = self.text(probe, generation_prompt=False)
            except Exception:  # noqa: BLE001 - a template that refuses the probe: use Qwen's token
                text = ""
            cut = text.rfind(_PROBE)
            after = text[cut + len(_PROBE):].split(None, 1) if cut >= 0 else []
            self._end_of_turn = after[0] if after else END_OF_TURN
        return self._end_of_turn

    def ends_turn(self, ids: list[int]) -> bool:
        """Whether sampled ids end with the end-of-turn token (the model finished its turn)."""
        return bool(ids) and self.tokenizer.decode([ids[-1]]) == self.end_of_turn()

    def tool_segment(self, before: list[dict], tool_messages: list[dict], *, closed: bool) -> str:
        """The text to append after a model turn: the template's closing of that turn the model did
        not generate, then the tool messages and the next generation prompt.

        closed: the model's ids already end with the end-of-turn token.
        """
        without = self.text(before, generation_prompt=False)
        with_tools = self.text(before + tool_messages, generation_prompt=True)
        if not with_tools.startswith(without):
            # Some templates render the LAST assistant turn differently (Qwen3 adds an empty
            # <think></think> to it): take the suffix from a stand-in conversation whose assistant
            # turn renders the same either way, as miles' own tool_call_utils does.
            without, with_tools = self._stand_in(tool_messages)
        suffix = with_tools[len(without):]
        end = self.end_of_turn()
        cut = without.rfind(end)
        closing = without[cut:] if cut >= 0 else ""  # e.g. "<|im_end|>\n"
        if closed and closing.startswith(end):
            closing = closing[len(end):]  # the model generated the end token; only the "\n" is missing
        return closing + suffix

    def _stand_in(self, tool_messages: list[dict]) -> tuple[str, str]:
        calls = [
            {"id": m.get("tool_call_id") or f"call_{i}", "type": "function",
             "function": {"name": m.get("name") or "execute_sql_query", "arguments": {}}}
            for i, m in enumerate(tool_messages)
        ]
        base = [{"role": "user", "content": "stand-in"},
                {"role": "assistant", "content": "", "reasoning_content": " ", "tool_calls": calls}]
        without = self.text(base, generation_prompt=False)
        with_tools = self.text(base + tool_messages, generation_prompt=True)
        if not with_tools.startswith(without):
            raise AdapterError(
                "the chat template renders earlier turns differently once tool messages are added "
                "(not append-only), so tool tokens cannot be appended; use a template that keeps "
                "earlier turns unchanged"
            )
        return without, with_tools
