"""Assistant text -> ordered tool calls, in the Hermes / Qwen format.

A call is written as::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

Some models write several calls as one JSON array in a single block::

    <tool_call>
    [{"name": "lookup", "arguments": {"q": "a"}}, {"name": "lookup", "arguments": {"q": "b"}}]
    </tool_call>

Each element of such an array is one call. Pure functions: no engine, no I/O. Malformed calls are returned as
`ToolCallError` items so the environment can answer them with error text; nothing here raises on model output
(JSON the decoder refuses, nested more than `MAX_JSON_DEPTH` levels deep or holding an integer too long to convert,
is a `ToolCallError` too).

Nesting is bounded before decoding, by `json_nesting_exceeds`, not by the decoder running into the interpreter's
recursion limit: that limit is process-wide state that libraries raise (then 1,000 nested brackets decoded in one
process and failed in another), and past it the C decoder's recursion can overflow the thread's stack.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "action_text",
    "ParsedToolCall",
    "ToolCall",
    "ToolCallError",
    "json_nesting_exceeds",
    "parse_tool_calls",
    "split_thought",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are refused unread (a tool call's JSON here, a request body in the
server). Tool arguments nest a few levels; 64 leaves room for any real schema, far below the recursion limit."""

_DECODER = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"
# Everything the JSON decoder raises on bad input: `JSONDecodeError` (a `ValueError`), `ValueError` for an integer
# literal past Python's digit limit, `RecursionError` should the stack already be deep when it decodes.
_JSON_ERRORS = (ValueError, RecursionError)
_TOO_DEEP = f"nested too deeply (more than {MAX_JSON_DEPTH} levels)"
# JSON text as consecutive tokens: a run of other characters, a string (its closing quote optional, so that an
# unterminated one is a single token and nothing is scanned twice; possessive, so the regex engine keeps no
# backtracking state per escape), or one bracket. Linear in the text, constant memory.
_NESTING_TOKENS = re.compile(r'[^"\[\]{}]+|"(?:[^"\\]+|\\.)*+"?|[\[\]{}]', re.DOTALL)
# A character JSON allows outside strings in no value: the value ends there (the decoder then fails), so the scan
# can stop. Keeps the scan of a tool call in prose short.
_NOT_JSON = re.compile(r"[^ \t\n\r0-9+\-.eE,:truefalsn]")
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


class _TooDeep(ValueError):
    pass


def json_nesting_exceeds(text: str, start: int = 0, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON value at `text[start]` (after any whitespace) nests arrays/objects more than `limit` deep.

    Brackets inside strings do not count. Only the first value is scanned: the scan stops where its outermost
    bracket closes. Text that is not valid JSON is scanned the same way (the decoder then says what is wrong).
    Iterative, linear in the text: safe on any input.
    """
    depth = 0
    for match in _NESTING_TOKENS.finditer(text, start):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif token in ("]", "}"):
            depth -= 1
            if depth <= 0:
                return False
        elif (depth == 0 and not token.isspace()) or (token[0] != '"' and _NOT_JSON.search(token)):
            return False  # a scalar, or where the JSON ends: nothing nests deeper from here
    return False


def _decode(text: str, pos: int) -> tuple[Any, int]:
    """`raw_decode` of the value at `text[pos]`, refusing nesting past `MAX_JSON_DEPTH` before it decodes."""
    if json_nesting_exceeds(text, pos):
        raise _TooDeep(_TOO_DEEP)
    return _DECODER.raw_decode(text, pos)


def _loads(text: str) -> Any:
    """`json.loads`, refusing nesting past `MAX_JSON_DEPTH` before it decodes."""
    if json_nesting_exceeds(text):
        raise _TooDeep(_TOO_DEEP)
    return json.loads(text)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A well-formed tool call: a name and a JSON object of arguments."""

    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """A tool call the model attempted but wrote wrongly; `message` is meant for the model."""

    message: str
    raw: str


ParsedToolCall = ToolCall | ToolCallError


def _to_call(obj: Any, raw: str) -> ParsedToolCall:
    if not isinstance(obj, dict):
        return ToolCallError(f"a tool call must be a JSON object, got {type(obj).__name__}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError('a tool call needs a "name" string', raw)
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = _loads(arguments) if arguments.strip() else {}
        except _JSON_ERRORS as exc:
            return ToolCallError(f'"arguments" of {name!r} is a string that is not valid JSON: {_reason(exc)}', raw)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallError(f'"arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}', raw)
    return ToolCall(name=name.strip(), arguments=arguments, raw=raw)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, (RecursionError, _TooDeep)):
        return _TOO_DEEP
    return str(exc).split(";")[0]  # e.g. an integer past Python's digit limit, without the advice for programmers


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _JSON_SPACE:
        pos += 1
    return pos


def _array_calls(text: str, start: int) -> list[ParsedToolCall]:
    """The calls of a JSON array that starts at `text[start]` and is known to decode: one per element."""
    calls: list[ParsedToolCall] = []
    pos = _skip_space(text, start + 1)
    if text[pos] == "]":
        return [ToolCallError("empty array of tool calls", text[start : pos + 1])]
    while True:
        try:
            obj, end = _DECODER.raw_decode(text, pos)  # an element of an array that passed the depth check
        except _JSON_ERRORS as exc:  # only if this deeper call stack meets the recursion limit the array did not
            return [*calls, ToolCallError(f"invalid JSON in tool call: {_reason(exc)}", text[pos:].strip())]
        calls.append(_to_call(obj, text[pos:end]))
        pos = _skip_space(text, end)
        if text[pos] != ",":  # "]": the decoder accepted the whole array
            return calls
        pos = _skip_space(text, pos + 1)


def parse_tool_calls(text: str) -> list[ParsedToolCall]:
    """Every `<tool_call>` block of `text`, in order.

    The JSON body is read with a JSON decoder, so `}` or `</tool_call>` inside a string argument does not end the
    call. A balanced JSON object with no closing tag (cut by a stop string, or at the end of the text) is accepted.
    A block holding a JSON array gives one entry per element: an object is read as a call, anything else is a
    `ToolCallError` for that element alone.

    Args:
        text: the assistant message content (any string: this never raises).

    Returns:
        One `ToolCall` or `ToolCallError` per `<tool_call>` opening tag (per element for a JSON array); an empty
        list means no tool call, i.e. a final answer.
    """
    calls: list[ParsedToolCall] = []
    pos = text.find(TOOL_CALL_OPEN)
    while pos != -1:
        body_start = pos + len(TOOL_CALL_OPEN)
        start = body_start
        while start < len(text) and text[start].isspace():
            start += 1
        try:
            obj, end = _decode(text, start)
        except _JSON_ERRORS as exc:
            # The bad call ends at its closing tag, or at the next opening tag if that comes first.
            ends = [i for i in (text.find(TOOL_CALL_CLOSE, body_start), text.find(TOOL_CALL_OPEN, body_start)) if i != -1]
            stop = min(ends, default=len(text))
            raw = text[body_start:stop].strip()
            if not raw:
                detail = "empty tool call"
            elif isinstance(exc, json.JSONDecodeError):
                detail = f"invalid JSON in tool call: {exc.msg} at offset {exc.pos - start}"
            else:
                detail = f"invalid JSON in tool call: {_reason(exc)}"
            calls.append(ToolCallError(detail, raw))
            pos = text.find(TOOL_CALL_OPEN, stop)
            continue
        raw = text[start:end]
        rest = end
        while rest < len(text) and text[rest].isspace():
            rest += 1
        closed = text.startswith(TOOL_CALL_CLOSE, rest)
        if closed or rest >= len(text) or text.startswith(TOOL_CALL_OPEN, rest):
            # With its closing tag, or without one (removed by a stop string, or never written).
            rest += len(TOOL_CALL_CLOSE) if closed else 0
            calls.extend(_array_calls(text, start) if isinstance(obj, list) else [_to_call(obj, raw)])
        else:
            tail = text[rest : rest + 20]
            calls.append(ToolCallError(f"unexpected text after the tool call JSON: {tail!r}", raw))
        pos = text.find(TOOL_CALL_OPEN, rest)
    return calls


def split_thought(text: str) -> tuple[str, str]:
    """Split `<think>...</think>` reasoning from the rest of an assistant message.

    Returns:
        (thought, remainder): the text inside the first think block ("" if none) and the text outside it.
    """
    match = _THINK.search(text)
    if match is None:
        return "", text
    return match.group(1).strip(), (text[: match.start()] + text[match.end() :]).strip()


def action_text(content: str) -> str:
    """The tool-call part of an assistant turn (its text from the first `<tool_call>` on); "" for a final answer.

    What `Step.action` records, for the rollout and the server's capture alike.
    """
    at = content.find(TOOL_CALL_OPEN)
    return content[at:] if at >= 0 else ""
