"""HTTP clients for the model endpoints `t2sql eval` talks to.

Two wire formats, both plain JSON over HTTP:

- `OpenAIChatClient`: an OpenAI-compatible `/v1/chat/completions` server (sglang, vLLM,
  llama.cpp, ...). One call = one assistant turn; the server applies the chat template.
- `SglangGenerateClient`: sglang's token-level `/generate`, the call miles makes in training:
  `input_ids` in, `text`, `meta_info.finish_reason.type` and `meta_info.output_token_logprobs`
  out. The caller owns the token ids (see `t2sql.eval.policies.SglangPolicy`).

Both retry what may heal (connection errors, timeouts, HTTP 408/429/5xx, a garbled body) with
exponential backoff and raise `EndpointError` once the retries are spent, or at once for what will
not heal (another 4xx, a reply that is JSON but not the shape the format promises: each reply is
checked field by field in one place per API, `parse_chat_completion` and `parse_generate`, and the
error names the field). Nothing here knows about episodes, SQL or rewards.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any, NoReturn

import httpx

from t2sql.errors import EndpointError

# HTTP statuses worth another try: the server is busy, restarting or overloaded.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# The largest reply read: one turn of a few thousand tokens is tens of KB (with per-token
# log-probs for a whole context, about a MB). Anything far larger is a broken server.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class _BodyTooLarge(Exception):
    def __init__(self, size: int):
        self.size = size


@dataclass(frozen=True)
class RetryPolicy:
    """How long one request may take and how often it is tried again."""

    timeout_s: float = 600.0  # one whole HTTP request, body included (a long thinking turn takes minutes)
    retries: int = 3  # extra attempts after the first
    backoff_s: float = 1.0  # wait before retry k is backoff_s * 2**k, with jitter
    max_backoff_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger reply is refused, never read whole

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"the reply size limit must be > 0 bytes, got {self.max_body_bytes}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0:
            raise ValueError(f"retry backoff must be >= 0 seconds, got {self.backoff_s}")

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * random.uniform(0.5, 1.0)  # jitter: concurrent episodes do not retry in step


@dataclass
class CallStats:
    """What the endpoint cost one episode: requests, retries, tokens, time."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the messages of retried failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "elapsed_s": round(self.elapsed_s, 3),
            "errors": self.errors[-5:],
        }


def join_url(base: str, path: str) -> str:
    """`base` may already end with `path` (or with `/v1` for chat completions)."""
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"endpoint {base!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:30000")
    base = base.rstrip("/")
    if base.endswith(path):
        return base
    if path.startswith("/v1/") and base.endswith("/v1"):
        return base + path[len("/v1") :]
    return base + path


class JsonHttpClient:
    """POST JSON, get JSON, with timeouts, retries and backoff. One per endpoint, shared by episodes."""

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy,
        headers: dict[str, str] | None = None,
        max_connections: int = 64,
    ):
        self.url = url
        self.retry = retry
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(retry.timeout_s, connect=min(10.0, retry.timeout_s)),
            headers=headers or {},
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            trust_env=False,  # a proxy from the environment must not capture a loopback endpoint
        )

    async def post(self, payload: dict[str, Any], stats: CallStats | None = None) -> dict[str, Any]:
        stats = stats if stats is not None else CallStats()
        loop = asyncio.get_running_loop()
        last_error = ""
        attempts = self.retry.retries + 1
        never_connected = True
        for attempt in range(attempts):
            if attempt:
                stats.retries += 1
                await asyncio.sleep(self.retry.delay(attempt - 1))
            stats.requests += 1
            started = loop.time()
            try:
                # The whole request (connect, send, wait, the body to its last byte) within timeout_s.
                status, content = await asyncio.wait_for(self._exchange(payload), self.retry.timeout_s)
            except asyncio.TimeoutError:
                never_connected = False
                last_error = (f"no complete answer within {self.retry.timeout_s:g}s "
                              "(raise --timeout if turns are long)")
            except httpx.TimeoutException:
                never_connected = False
                last_error = f"no answer within {self.retry.timeout_s:g}s (raise --timeout if turns are long)"
            except httpx.ConnectError as exc:
                last_error = f"cannot connect: {type(exc).__name__}: {exc}"
            except httpx.TransportError as exc:
                never_connected = False
                last_error = f"connection failed: {type(exc).__name__}: {exc}"
            except _BodyTooLarge as exc:
                stats.elapsed_s += loop.time() - started
                raise EndpointError(
                    f"{self.url} sent a reply of more than {self.retry.max_body_bytes} bytes "
                    f"(read {exc.size} before stopping); one turn is far smaller, so the server is "
                    "misbehaving (raise --max-response-mb only if replies really are that large)",
                    url=self.url,
                    attempts=attempt + 1,
                    retryable=False,
                ) from None
            else:
                never_connected = False
                text = content.decode("utf-8", "replace")
                if status == 200:
                    try:
                        body = json.loads(content)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        last_error = f"HTTP 200 but the body is not JSON: {text[:200]!r}"
                    else:
                        if isinstance(body, dict):
                            stats.elapsed_s += loop.time() - started
                            return body
                        last_error = f"HTTP 200 but the body is {type(body).__name__}, not a JSON object"
                elif status in RETRYABLE_STATUS:
                    last_error = f"HTTP {status}: {text[:300]}"
                else:
                    stats.elapsed_s += loop.time() - started
                    raise EndpointError(
                        f"{self.url} answered HTTP {status}: {text[:500]} "
                        "(check --endpoint, --model and --api; this is not retried)",
                        url=self.url,
                        attempts=attempt + 1,
                        retryable=False,
                    )
            stats.elapsed_s += loop.time() - started
            stats.errors.append(last_error)
        raise EndpointError(
            f"{self.url} failed {attempts} time(s); last error: {last_error} "
            "(is the server up? raise --retries/--timeout for a slow server)",
            url=self.url,
            attempts=attempts,
            retryable=True,
            unreachable=never_connected,
        )

    async def _exchange(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        """POST and read the reply, refusing it past max_body_bytes (never held whole)."""
        limit = self.retry.max_body_bytes
        async with self._client.stream("POST", self.url, json=payload) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise _BodyTooLarge(int(declared))
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise _BodyTooLarge(size)
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(frozen=True)
class ChatTurn:
    """One assistant turn from a chat-completions endpoint."""

    text: str  # the full turn, reasoning included as <think>...</think> when the server split it off
    finish_reason: str  # "stop", "tool_calls", "length", ...
    tool_calls: list[dict[str, Any]] | None  # structured OpenAI tool_calls, when the server parsed them
    prompt_tokens: int | None
    completion_tokens: int | None


class OpenAIChatClient:
    """An OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        retry: RetryPolicy = RetryPolicy(),
        sampling: dict[str, Any] | None = None,
        api_key: str | None = None,
        extra_body: dict[str, Any] | None = None,
        max_connections: int = 64,
    ):
        if not model:
            raise ValueError("--model is required with --api openai (the name the server serves)")
        self.model = model
        self.sampling = dict(sampling or {})
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = JsonHttpClient(
            join_url(endpoint, "/v1/chat/completions"), retry=retry, headers=headers, max_connections=max_connections
        )

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        max_tokens: int,
        stats: CallStats | None = None,
    ) -> ChatTurn:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [wire_message(m) for m in messages],
            "tools": tools,
            "max_tokens": max_tokens,
            **self.sampling,
            **self.extra_body,
        }
        body = await self.http.post(payload, stats)
        turn = parse_chat_completion(body, url=self.http.url)
        if stats is not None:
            stats.prompt_tokens += turn.prompt_tokens or 0
            stats.completion_tokens += turn.completion_tokens or 0
        return turn

    async def aclose(self) -> None:
        await self.http.aclose()


# The keys of a chat message the OpenAI wire format knows; episode bookkeeping stays home.
_WIRE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


def wire_message(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: message[k] for k in _WIRE_KEYS if k in message and message[k] is not None}
    calls = out.get("tool_calls")
    if calls:
        # The wire wants arguments as a JSON string; an episode may hold them as a dict.
        out["tool_calls"] = [_wire_tool_call(c, i) for i, c in enumerate(calls)]
    if out.get("role") == "assistant" and "content" not in out:
        out["content"] = ""
    return out


def _wire_tool_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        function["arguments"] = json.dumps(arguments, ensure_ascii=False)
    return {"id": call.get("id") or f"call_{index}", "type": call.get("type", "function"), "function": function}


def parse_chat_completion(body: dict[str, Any], *, url: str = "") -> ChatTurn:
    """Read one chat-completions reply; a reply of another shape is an EndpointError naming the field."""
    try:
        return _read_chat_completion(body)
    except _WrongShape as e:
        _wrong_shape(url, e, body, "is it an OpenAI-compatible chat endpoint? for sglang's /generate use --api sglang"
                     if e.where == "choices" else None)


def _read_chat_completion(body: dict[str, Any]) -> ChatTurn:
    choices = body.get("choices", _MISSING)
    if not isinstance(choices, list) or not choices:
        raise _WrongShape("choices", "a non-empty list", choices)
    choice = _object(choices[0], "choices[0]")
    message = _object(choice.get("message", _MISSING), "choices[0].message")
    content = _content(message.get("content"), "choices[0].message.content")
    # Servers run with a reasoning parser return the thinking separately; the episode reads whole turns.
    reasoning = (_optional_str(message, "reasoning_content", "choices[0].message")
                 or _optional_str(message, "reasoning", "choices[0].message") or "")
    text = f"<think>{reasoning}</think>\n\n{content}" if reasoning and "<think>" not in content else content
    usage = body.get("usage")
    usage = {} if usage is None else _object(usage, "usage")
    return ChatTurn(
        text=text,
        finish_reason=_optional_str(choice, "finish_reason", "choices[0]") or "stop",
        tool_calls=_tool_calls(message.get("tool_calls"), "choices[0].message.tool_calls"),
        prompt_tokens=_optional_int(usage, "prompt_tokens", "usage"),
        completion_tokens=_optional_int(usage, "completion_tokens", "usage"),
    )


def _content(value: Any, where: str) -> str:
    """A message's content: a string, null (a turn of tool calls only), or OpenAI's list of text
    parts, joined in order. A part of another type (an image, audio, a refusal) is refused, never
    dropped: the episode would grade a turn the model did not write."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _WrongShape(where, "a string or a list of text parts", value)
    texts: list[str] = []
    for i, part in enumerate(value):
        part = _object(part, f"{where}[{i}]")
        if part.get("type") != "text":
            raise _WrongShape(f"{where}[{i}].type", '"text" (the only part t2sql reads)', part.get("type", _MISSING))
        text = part.get("text", _MISSING)
        if not isinstance(text, str):
            raise _WrongShape(f"{where}[{i}].text", "a string", text)
        texts.append(text)
    return "".join(texts)


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]] | None:
    """OpenAI tool_calls: a list of {"id", "type", "function": {"name", "arguments"}}. The server
    builds this structure; what the model wrote is in `arguments` (a JSON string, or an object from
    some servers), which the episode parses and penalizes when it is not valid JSON."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise _WrongShape(where, "a list of tool calls", value)
    for i, call in enumerate(value):
        call = _object(call, f"{where}[{i}]")
        _optional_str(call, "id", f"{where}[{i}]")
        function = _object(call.get("function", _MISSING), f"{where}[{i}].function")
        name = function.get("name", _MISSING)
        if not isinstance(name, str):
            raise _WrongShape(f"{where}[{i}].function.name", "a string", name)
        arguments = function.get("arguments", _MISSING)
        if not isinstance(arguments, (str, dict)):
            raise _WrongShape(f"{where}[{i}].function.arguments", "a JSON string or an object", arguments)
    return list(value)


@dataclass(frozen=True)
class GenerateTurn:
    """One reply from sglang's /generate."""

    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    output_ids: list[int] | None  # from meta_info.output_token_logprobs, when the server sent them
    output_logprobs: list[float] | None
    prompt_tokens: int | None
    completion_tokens: int | None


# The text miles asks sglang for in training (miles' rollout sampling params): special tokens kept
# and the stop token left in, so an episode reads the same text in eval as in training.
TRAINING_TEXT_PARAMS = {"skip_special_tokens": False, "no_stop_trim": True}


class SglangGenerateClient:
    """sglang's token-level /generate, called the way miles calls it in training."""

    def __init__(
        self,
        endpoint: str,
        *,
        retry: RetryPolicy = RetryPolicy(),
        sampling: dict[str, Any] | None = None,
        max_connections: int = 64,
    ):
        self.sampling = {**TRAINING_TEXT_PARAMS, **(sampling or {})}
        self.http = JsonHttpClient(join_url(endpoint, "/generate"), retry=retry, max_connections=max_connections)

    async def generate(
        self, input_ids: list[int], *, max_new_tokens: int, stats: CallStats | None = None
    ) -> GenerateTurn:
        payload = {
            "input_ids": list(input_ids),
            "sampling_params": {**self.sampling, "max_new_tokens": max_new_tokens},
            "return_logprob": True,
        }
        body = await self.http.post(payload, stats)
        turn = parse_generate(body, url=self.http.url)
        if turn.finish_reason == "abort":
            # miles marks these ABORTED; for an eval the server dropped the request: try it again.
            turn = await self._retry_aborted(payload, stats)
        if stats is not None:
            stats.prompt_tokens += turn.prompt_tokens or 0
            stats.completion_tokens += turn.completion_tokens or 0
        return turn

    async def _retry_aborted(self, payload: dict[str, Any], stats: CallStats | None) -> GenerateTurn:
        for attempt in range(self.http.retry.retries):
            await asyncio.sleep(self.http.retry.delay(attempt))
            if stats is not None:
                stats.retries += 1
            turn = parse_generate(await self.http.post(payload, stats), url=self.http.url)
            if turn.finish_reason != "abort":
                return turn
        raise EndpointError(
            f"{self.http.url} aborted the request {self.http.retry.retries + 1} time(s) "
            "(the server is shedding load or restarting)",
            url=self.http.url,
            attempts=self.http.retry.retries + 1,
            retryable=True,
        )

    async def aclose(self) -> None:
        await self.http.aclose()


def parse_generate(body: dict[str, Any], *, url: str = "") -> GenerateTurn:
    """Read one /generate reply; a reply of another shape is an EndpointError naming the field."""
    try:
        return _read_generate(body)
    except _WrongShape as e:
        _wrong_shape(url, e, body, "is it sglang's /generate? for a chat-completions server use --api openai"
                     if e.where in ("text", "meta_info") else None)


def _read_generate(body: dict[str, Any]) -> GenerateTurn:
    text = body.get("text", _MISSING)
    if not isinstance(text, str):
        raise _WrongShape("text", "a string", text)
    meta = _object(body.get("meta_info", _MISSING), "meta_info")
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        finish_type = _optional_str(finish, "type", "meta_info.finish_reason")
    elif finish is None or isinstance(finish, str):
        finish_type = finish
    else:
        raise _WrongShape("meta_info.finish_reason", 'an object {"type": ...}, a string or null', finish)
    output_ids: list[int] | None = None
    output_logprobs: list[float] | None = None
    entries = meta.get("output_token_logprobs")
    if entries is not None:  # absent: the ids are the text re-encoded; present, they must be whole
        where = "meta_info.output_token_logprobs"
        if not isinstance(entries, list):
            raise _WrongShape(where, "a list of [logprob, token_id, text] entries", entries)
        output_ids, output_logprobs = [], []
        for i, entry in enumerate(entries):
            if not isinstance(entry, list) or len(entry) < 2:
                raise _WrongShape(f"{where}[{i}]", "a list [logprob, token_id, text]", entry)
            logprob, token = entry[0], entry[1]
            if not isinstance(logprob, (int, float)) or isinstance(logprob, bool):
                raise _WrongShape(f"{where}[{i}][0]", "a number (the token's log-probability)", logprob)
            if not _is_int(token) or token < 0:
                raise _WrongShape(f"{where}[{i}][1]", "a token id (an integer >= 0)", token)
            output_logprobs.append(float(logprob))
            output_ids.append(token)
    return GenerateTurn(
        text=text,
        finish_reason=finish_type or "stop",
        output_ids=output_ids,
        output_logprobs=output_logprobs,
        prompt_tokens=_optional_int(meta, "prompt_tokens", "meta_info"),
        completion_tokens=_optional_int(meta, "completion_tokens", "meta_info"),
    )


# ---------------------------------------------------------------------------------------------
# Reply shapes: what a field must be, and an error that names it


_MISSING: Any = object()  # a field the reply does not have


class _WrongShape(Exception):
    def __init__(self, where: str, expected: str, value: Any):
        super().__init__(f"{where}: expected {expected}, got {_describe(value)}")
        self.where = where


def _describe(value: Any) -> str:
    if value is _MISSING:
        return "nothing (the field is missing)"
    kind = {type(None): "null", bool: "bool", dict: "object"}.get(type(value), type(value).__name__)
    if value is None:
        return kind
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return f"{kind} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _wrong_shape(url: str, error: _WrongShape, body: dict[str, Any], hint: str | None) -> NoReturn:
    """A reply that is JSON but not the format's shape will not heal: not retried in this run (as a
    reply without the format's fields), recorded as an endpoint_error that a rerun tries again."""
    hint = hint or "the server, or a proxy in front of it, is broken; not retried in this run"
    raise EndpointError(
        f"{url} sent a reply of the wrong shape: {error}; the reply: {json.dumps(body, default=str)[:300]} "
        f"({hint})",
        url=url,
        attempts=1,
        retryable=False,
    ) from None


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _WrongShape(where, "an object", value)
    return value


def _optional_str(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _WrongShape(f"{where}.{key}", "a string or null", value)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_int(obj: dict[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is not None and not _is_int(value):
        raise _WrongShape(f"{where}.{key}", "an integer or null", value)
    return value

