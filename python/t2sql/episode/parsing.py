"""Parsers of one assistant turn: thinking, the <solution> block, tool calls (XML or JSON, in the
text or structured). Total functions: model text never makes them raise."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from t2sql.episode.prompt import TOOL_NAME

_THINK_OPEN = "<think>"


_THINK_CLOSE = "</think>"


def split_think(text: str) -> tuple[str, str]:
    """(thinking, visible) of one turn.

    `<think>...</think>` blocks are thinking. An unclosed `<think>` (a turn cut by the limit)
    makes the rest of the turn thinking. A `</think>` with no `<think>` before it means the chat
    template opened the block in the prompt (Qwen3.x with thinking on): everything before it is
    thinking.
    """
    thinking: list[str] = []
    visible: list[str] = []
    rest = text
    close = rest.find(_THINK_CLOSE)
    opening = rest.find(_THINK_OPEN)
    if close != -1 and (opening == -1 or opening > close):
        thinking.append(rest[:close])
        rest = rest[close + len(_THINK_CLOSE):]
    while True:
        start = rest.find(_THINK_OPEN)
        if start == -1:
            visible.append(rest)
            break
        visible.append(rest[:start])
        end = rest.find(_THINK_CLOSE, start)
        if end == -1:
            thinking.append(rest[start + len(_THINK_OPEN):])
            break
        thinking.append(rest[start + len(_THINK_OPEN):end])
        rest = rest[end + len(_THINK_CLOSE):]
    return "".join(thinking), "".join(visible)


def strip_think(text: str) -> str:
    """The visible text of a turn: everything outside `<think>` (see `split_think`)."""
    return split_think(text)[1]


_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.S)


_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?```$", re.S)


def _clean_sql(sql: str) -> str:
    sql = sql.strip()
    fenced = _FENCE.match(sql)
    return fenced.group(1).strip() if fenced else sql


def parse_solution(visible: str) -> str | None:
    """The answer of a turn's visible text: the LAST `<solution>` block, or None if there is none.

    A final `<solution>` that is never closed counts too (adapters may stop generation at the
    `</solution>` stop string and trim it). Markdown code fences inside the block are removed.
    The query may be "" (an empty block): grading decides what that earns.
    """
    blocks = [m for m in _SOLUTION.finditer(visible)]
    tail_start = blocks[-1].end() if blocks else 0
    unclosed = visible.find("<solution>", tail_start)
    if unclosed != -1:
        return _clean_sql(visible[unclosed + len("<solution>"):])
    if blocks:
        return _clean_sql(blocks[-1].group(1))
    return None


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made. `error` says why it is malformed (None = valid)."""

    name: str | None
    query: str | None
    error: str | None
    raw: str
    id: str | None = None  # the endpoint's tool_call id, for structured calls

    @property
    def valid(self) -> bool:
        return self.error is None


def _checked(name: Any, args: Any, raw: str, call_id: str | None = None) -> ToolCall:
    if not isinstance(name, str) or not name.strip():
        return ToolCall(None, None, "the tool call has no function name", raw, call_id)
    name = name.strip()
    if name != TOOL_NAME:
        return ToolCall(name, None, f"unknown tool {name!r}; the only tool is {TOOL_NAME}", raw, call_id)
    if not isinstance(args, dict):
        return ToolCall(name, None, "the arguments are not an object with a 'query' field", raw, call_id)
    query = args.get("query")
    if not isinstance(query, str):
        return ToolCall(name, None, "the 'query' argument is missing (or not a string)", raw, call_id)
    if not query.strip():
        return ToolCall(name, None, "the 'query' argument is empty", raw, call_id)
    return ToolCall(name, query.strip(), None, raw, call_id)


_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)</function>\s*$", re.S)


_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


def _parse_xml_call(body: str, raw: str) -> ToolCall:
    m = _FUNCTION.match(body)
    if not m:
        return ToolCall(None, None, "the <function=...> block is not closed with </function>", raw)
    name, inner = m.group(1).strip(), m.group(2)
    args: dict[str, str] = {}
    for p in _PARAMETER.finditer(inner):
        key = p.group(1).strip()
        if key in args:
            return ToolCall(name, None, f"parameter {key!r} is given twice", raw)
        args[key] = p.group(2).strip("\n")
    leftover = _PARAMETER.sub("", inner)
    if "<parameter=" in leftover:
        return ToolCall(name, None, "a <parameter=...> block is not closed with </parameter>", raw)
    return _checked(name, args, raw)


def _parse_json_call(body: str, raw: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, None, f"the tool call is not valid JSON ({e.msg} at position {e.pos})", raw)
    if not isinstance(obj, dict):
        return ToolCall(None, None, "the tool call JSON is not an object", raw)
    args = obj.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return ToolCall(obj.get("name") if isinstance(obj.get("name"), str) else None, None,
                            f"the arguments string is not valid JSON ({e.msg})", raw)
    return _checked(obj.get("name"), args, raw)


def parse_tool_calls(visible: str) -> list[ToolCall]:
    """Every tool call in a turn's visible text, in order; malformed ones carry `error`.

    Forms: `<tool_call><function=NAME><parameter=query>SQL</parameter></function></tool_call>`
    (qwen3_coder) and `<tool_call>{"name": NAME, "arguments": {...} or "<json>"}</tool_call>`.
    A final `<tool_call>` never closed (generation stopped at the stop string) is parsed as if
    closed. A `<function=...>` outside any `<tool_call>` claims to be a tool call: it is malformed.
    """
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = visible.find("<tool_call>", pos)
        if start == -1:
            _stray_functions(visible[pos:], calls)
            break
        _stray_functions(visible[pos:start], calls)
        end = visible.find("</tool_call>", start)
        body_start = start + len("<tool_call>")
        if end == -1:
            body, pos = visible[body_start:], len(visible)
            raw = visible[start:]
        else:
            body, pos = visible[body_start:end], end + len("</tool_call>")
            raw = visible[start:pos]
        body = body.strip()
        if body.startswith("<function="):
            calls.append(_parse_xml_call(body, raw))
        elif body.startswith(("{", "[")):
            calls.append(_parse_json_call(body, raw))
        elif not body:
            calls.append(ToolCall(None, None, "the <tool_call> block is empty", raw))
        else:
            calls.append(ToolCall(None, None, "the <tool_call> block is neither the XML nor the JSON form", raw))
    return calls


def _stray_functions(segment: str, calls: list[ToolCall]) -> None:
    for m in re.finditer(r"<function=[^>\n]*>", segment):
        calls.append(ToolCall(None, None, "a <function=...> block outside <tool_call>...</tool_call>", m.group(0)))


def parse_structured_tool_calls(tool_calls: Sequence[Any]) -> list[ToolCall]:
    """OpenAI-style `tool_calls` ([{"id", "type": "function", "function": {"name", "arguments"}}])."""
    calls: list[ToolCall] = []
    for item in tool_calls:
        raw = json.dumps(item, ensure_ascii=False, default=str)
        if not isinstance(item, dict) or not isinstance(item.get("function"), dict):
            calls.append(ToolCall(None, None, "the tool call has no 'function' object", raw))
            continue
        call_id = item.get("id") if isinstance(item.get("id"), str) else None
        fn = item["function"]
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                calls.append(ToolCall(fn.get("name") if isinstance(fn.get("name"), str) else None, None,
                                      f"the arguments string is not valid JSON ({e.msg})", raw, call_id))
                continue
        calls.append(_checked(fn.get("name"), args, raw, call_id))
    return calls


def tool_call_from_arguments(arguments: Any, call_id: str | None = None) -> ToolCall:
    """One call of the tool from its arguments alone (a framework that calls tools one at a time):
    an object `{"query": SQL}` or its JSON text; anything else is a malformed call."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, default=str)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(TOOL_NAME, None, f"the arguments string is not valid JSON ({e.msg})", raw, call_id)
    return _checked(TOOL_NAME, dict(arguments) if isinstance(arguments, Mapping) else arguments, raw, call_id)


_BLOCKS = re.compile(r"<tool_call>.*?(?:</tool_call>|$)|<solution>.*?(?:</solution>|$)", re.S)


def prose(visible: str) -> str:
    """Visible text without its `<tool_call>` and `<solution>` blocks (what the evidence rules read)."""
    return _BLOCKS.sub(" ", visible)
