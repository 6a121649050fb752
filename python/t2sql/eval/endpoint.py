"""HTTP clients for the model endpoints `t2sql eval` talks to: `OpenAIChatClient` (`/v1/chat/completions`, one call
one assistant turn) and `SglangGenerateClient` (sglang's token-level `/generate`, the call miles makes). Both retry
what may heal and raise `EndpointError` once the retries are spent or at once for what will not; each reply is
checked field by field in t2sql.eval.replies. Nothing here knows about episodes, SQL or rewards."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from t2sql.errors import EndpointError
from t2sql.eval.replies import ChatTurn, GenerateTurn, parse_chat_completion, parse_generate

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
                              "(raise --timeout-s if turns are long)")
            except httpx.TimeoutException:
                never_connected = False
                last_error = f"no answer within {self.retry.timeout_s:g}s (raise --timeout-s if turns are long)"
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
            "(is the server up? raise --retries/--timeout-s for a slow server)",
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
