"""What a model endpoint's reply must look like: one check per API, field by field, for the two wire
formats `t2sql.eval.endpoint`'s clients speak. `parse_chat_completion` (OpenAI-compatible
`/v1/chat/completions`) and `parse_generate` (sglang's `/generate`) return the turn or raise an
`EndpointError` naming the field that is not what the format promises (not retried: a server that sent
one wrong shape sends it again)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NoReturn

from t2sql.errors import EndpointError

_MISSING: Any = object()  # a field the reply does not have


@dataclass(frozen=True)
class ChatTurn:
    """One assistant turn from a chat-completions endpoint."""

    text: str  # the full turn, reasoning included as <think>...</think> when the server split it off
    finish_reason: str  # "stop", "tool_calls", "length", ...
    tool_calls: list[dict[str, Any]] | None  # structured OpenAI tool_calls, when the server parsed them
    prompt_tokens: int | None
    completion_tokens: int | None


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
