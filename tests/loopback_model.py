"""A scripted model behind a real HTTP server on 127.0.0.1, for the eval tests.

`LoopbackModel` answers as an OpenAI-compatible `/v1/chat/completions` endpoint and as sglang's
token-level `/generate` (the response schema miles reads: text, meta_info.finish_reason.type,
meta_info.output_token_logprobs). Replies come from a Python `script(conversation) -> Reply`.
Faults can be injected: the next N requests fail with an HTTP status, or hang for a while, or
every request gets one fixed JSON body (`answer_raw`: a reply of the wrong shape). With
`content_parts=True` the chat endpoint returns content as OpenAI's list of text parts.

`ByteTokenizer` is a small tokenizer built here (bytes + three special tokens) with a Qwen-style
chat template, so the sglang path runs without downloading a model: the server decodes the
input_ids it receives with it, and the eval encodes with it.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
END_OF_TURN = "<|im_end|>"


def expert_id(position: int, layer: int, k: int) -> int:
    """The scripted expert choice at a sequence position (a test can recompute it)."""
    return (position * 7 + layer * 3 + k) % 256


def routed_experts(positions: int, layers: int, topk: int) -> str:
    """sglang's meta_info.routed_experts: base64 int32, shape (positions, layers, topk)."""
    flat = [expert_id(p, la, k) for p in range(positions) for la in range(layers) for k in range(topk)]
    return base64.b64encode(struct.pack(f"<{len(flat)}i", *flat)).decode()


class ByteTokenizer:
    """Token ids 0-255 are bytes; 256.. are the special tokens. Not a real model's, but a real round trip."""

    def __init__(self) -> None:
        self.special_ids = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}
        self.special_text = {i: tok for tok, i in self.special_ids.items()}
        self.eos_token_id = self.special_ids["<|im_end|>"]
        self.eos_token = "<|im_end|>"
        self.renders = 0  # how often apply_chat_template ran (tests check kwargs reach every render)
        self.render_kwargs: list[dict[str, Any]] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for tok, tok_id in self.special_ids.items():
                if text.startswith(tok, i):
                    ids.append(tok_id)
                    i += len(tok)
                    break
            else:
                j = len(text)
                for tok in SPECIAL_TOKENS:
                    k = text.find(tok, i)
                    if k != -1:
                        j = min(j, k)
                ids.extend(text[i:j].encode("utf-8"))
                i = j
        return ids

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.special_ids[token]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out = bytearray()
        parts: list[str] = []
        for t in ids:
            if t in self.special_text:
                parts.append(out.decode("utf-8", "replace"))
                out.clear()
                if not skip_special_tokens:
                    parts.append(self.special_text[t])
            else:
                out.append(t)
        parts.append(out.decode("utf-8", "replace"))
        return "".join(parts)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> Any:
        self.renders += 1
        self.render_kwargs.append(dict(kwargs))
        text = ""
        rest = list(messages)
        system = ""
        if rest and rest[0].get("role") == "system":
            system = str(rest.pop(0).get("content") or "")
        if system or tools:
            text += "<|im_start|>system\n" + system
            if tools:
                text += ("\n\n# Tools\n<tools>\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
                         + "\n</tools>")
            text += "<|im_end|>\n"
        i = 0
        while i < len(rest):
            m = rest[i]
            role = m.get("role")
            if role == "tool":
                text += "<|im_start|>user"
                while i < len(rest) and rest[i].get("role") == "tool":
                    text += "\n<tool_response>\n" + str(rest[i].get("content") or "") + "\n</tool_response>"
                    i += 1
                text += "<|im_end|>\n"
                continue
            text += f"<|im_start|>{role}\n" + str(m.get("content") or "")
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                text += ("\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")})
                         + "\n</tool_call>")
            text += "<|im_end|>\n"
            i += 1
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
            if kwargs.get("enable_thinking") is False:
                text += "<think>\n\n</think>\n\n"
        return self.encode(text) if tokenize else text


@dataclass
class Conversation:
    """What the scripted model sees of one request."""

    api: str  # "openai" | "sglang"
    user: str  # the first user message (schema, evidence, question)
    turn: int  # 1 for the first assistant turn
    tool_results: list[str]  # the tool messages so far, oldest first
    max_tokens: int
    raw: Any  # the messages (openai) or the decoded prompt text (sglang)


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None  # openai only: returned structured
    reasoning: str | None = None  # openai only: returned as reasoning_content
    finish: str | None = None  # force a finish reason; default: "length" when cut, else "stop"


Script = Callable[[Conversation], Reply]


@dataclass
class RecordedRequest:
    path: str
    body: dict[str, Any]
    status: int = 200


@dataclass
class _Faults:
    fail: int = 0
    fail_status: int = 500
    hang: int = 0
    hang_s: float = 0.0
    delay_s: float = 0.0  # every request waits this long (slow model)


class LoopbackModel:
    """A scripted model on http://127.0.0.1:<free port>. Use as a context manager."""

    def __init__(self, script: Script, tokenizer: Any = None, *, routing: tuple[int, int] | None = None,
                 content_parts: bool = False):
        """tokenizer: ByteTokenizer by default, or a Hugging Face tokenizer (encode, decode,
        convert_tokens_to_ids, apply_chat_template). routing: (layers, topk) to answer
        return_routed_experts as sglang does, for the whole sequence. content_parts: the chat
        reply's content as a list of text parts (the text cut in three), as OpenAI may send it."""
        self.script = script
        self.content_parts = content_parts
        self.raw: Any = None  # set by answer_raw: every request gets this body as-is
        self.tokenizer = tokenizer or ByteTokenizer()
        self.routing = routing
        self.requests: list[RecordedRequest] = []
        self.faults = _Faults()
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- faults
    def fail_next(self, n: int, status: int = 500) -> None:
        with self._lock:
            self.faults.fail, self.faults.fail_status = n, status

    def hang_next(self, n: int, seconds: float) -> None:
        with self._lock:
            self.faults.hang, self.faults.hang_s = n, seconds

    def answer_raw(self, body: Any) -> None:
        """Every request from now on is answered HTTP 200 with `body` (any JSON), not the script's reply."""
        with self._lock:
            self.raw = body

    def slow(self, seconds: float) -> None:
        with self._lock:
            self.faults.delay_s = seconds

    # -- lifecycle
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LoopbackModel:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": "body is not JSON"})
                    return
                status, answer = model._handle(self.path, body)
                self._send(status, answer)

            def _send(self, status: int, answer: Any) -> None:
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): that is the point of a hang test

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()  # wake hanging handlers
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    # -- request handling
    def _handle(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            record = RecordedRequest(path, body)
            self.requests.append(record)
            delay = self.faults.delay_s
            hang = 0.0
            if self.faults.hang > 0:
                self.faults.hang -= 1
                hang = self.faults.hang_s
            fail = 0
            if self.faults.fail > 0:
                self.faults.fail -= 1
                fail = self.faults.fail_status
            raw = self.raw
        if hang:
            self._release.wait(hang)
        if delay:
            self._release.wait(delay)
        if fail:
            record.status = fail
            return fail, {"error": {"message": f"injected failure {fail}"}}
        if raw is not None:
            return 200, raw
        if path == "/v1/chat/completions":
            return 200, self._chat(body)
        if path == "/generate":
            return 200, self._generate(body)
        if path == "/abort_request":  # sglang's: miles aborts what is left at the end of a rollout
            return 200, {}
        record.status = 404
        return 404, {"error": f"no route {path}"}

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        tok = self.tokenizer
        prompt_ids = tok.encode(tok.apply_chat_template(messages, tools=body.get("tools"), add_generation_prompt=True,
                                                        tokenize=False), add_special_tokens=False)
        conversation = Conversation(
            api="openai",
            user=next((str(m.get("content")) for m in messages if m.get("role") == "user"), ""),
            turn=1 + sum(1 for m in messages if m.get("role") == "assistant"),
            tool_results=[str(m.get("content")) for m in messages if m.get("role") == "tool"],
            max_tokens=int(body.get("max_tokens") or 1 << 30),
            raw=messages,
        )
        reply = self.script(conversation)
        visible = ((f"<think>{reply.reasoning}</think>") if reply.reasoning else "") + reply.text
        ids = tok.encode(visible, add_special_tokens=False)
        finish = reply.finish
        content = reply.text
        if len(ids) > conversation.max_tokens:  # the server's own cut, as a real one would do
            cut = tok.decode(ids[: conversation.max_tokens])
            content, finish = cut, finish or "length"
            reply = Reply(text=cut)
            ids = ids[: conversation.max_tokens]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.content_parts:
            third = max(1, len(content) // 3)
            cuts = [content[:third], content[third:2 * third], content[2 * third:]]
            message["content"] = [{"type": "text", "text": piece} for piece in cuts]
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": finish or ("tool_calls" if reply.tool_calls else "stop"),
            }],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                      "total_tokens": len(prompt_ids) + len(ids)},
        }

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        tok = self.tokenizer
        input_ids = body["input_ids"]
        prompt = tok.decode(input_ids)
        max_new = int(body["sampling_params"]["max_new_tokens"])
        first_user = (prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
                      if "<|im_start|>user\n" in prompt else "")
        tool_results = [
            chunk.split("\n</tool_response>", 1)[0] for chunk in prompt.split("<tool_response>\n")[1:]
        ]
        conversation = Conversation(
            api="sglang",
            user=first_user,
            turn=prompt.count("<|im_start|>assistant\n"),
            tool_results=tool_results,
            max_tokens=max_new,
            raw=prompt,
        )
        reply = self.script(conversation)
        ids = tok.encode(reply.text, add_special_tokens=False)
        if reply.finish != "abort":
            ids.append(tok.convert_tokens_to_ids(END_OF_TURN))  # the model ends its turn with <|im_end|>
        finish = reply.finish or "stop"
        if len(ids) > max_new:
            ids, finish = ids[:max_new], "length"
        # sglang's text: special tokens dropped unless skip_special_tokens is false, and the stop
        # token trimmed unless no_stop_trim (miles sends false / true).
        params = body["sampling_params"]
        text = tok.decode(ids, skip_special_tokens=params.get("skip_special_tokens", True))
        if finish == "stop" and not params.get("no_stop_trim", False) and text.endswith(END_OF_TURN):
            text = text[: -len(END_OF_TURN)]
        meta: dict[str, Any] = {
            "finish_reason": {"type": finish},
            "output_token_logprobs": [[-0.5 - 0.01 * (i % 7), t, tok.decode([t])] for i, t in enumerate(ids)],
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": "loopback",
        }
        if body.get("return_routed_experts") and self.routing is not None:
            layers, topk = self.routing
            meta["routed_experts"] = routed_experts(len(input_ids) + len(ids) - 1, layers, topk)
        return {"text": text, "meta_info": meta}

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def wait_for_requests(self, n: int, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.requests) >= n:
                return True
            time.sleep(0.01)
        return False


@dataclass
class TaskScript:
    """A scripted model that knows the tasks: finds the task by its question, asks `plan` for the reply."""

    tasks: list[Any]
    plan: Callable[[Any, Conversation], Reply]
    seen: list[str] = field(default_factory=list)

    def __call__(self, conversation: Conversation) -> Reply:
        matches = [t for t in self.tasks if t.question in conversation.user]
        if not matches:
            return Reply(text="I do not know this task.")
        task = max(matches, key=lambda t: len(t.question))  # a question may contain a shorter one
        self.seen.append(task.question_id)
        return self.plan(task, conversation)


def xml_tool_call(sql: str) -> str:
    """The qwen3_coder form of an execute_sql_query call, as Qwen3.5/3.6 write it."""
    return (
        "<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n"
        f"{sql}\n</parameter>\n</function>\n</tool_call>"
    )


def json_tool_call(sql: str) -> str:
    """The older Qwen3 form: JSON inside <tool_call>."""
    return "<tool_call>\n" + json.dumps({"name": "execute_sql_query", "arguments": {"query": sql}}) + "\n</tool_call>"


def structured_tool_call(sql: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "execute_sql_query", "arguments": json.dumps({"query": sql})}}
