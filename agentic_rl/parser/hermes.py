"""The JSON form inside `<tool_call>` (`HERMES`: Hermes, Qwen2.5, Qwen3): a JSON object, or a JSON array of them
(one call per element)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>
"""

from __future__ import annotations

import json

from agentic_rl.parser.calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParsedToolCall, ToolCallError, to_call
from agentic_rl.parser.json_text import DECODER, JSON_ERRORS, Next, decode, reason, skip_blank, skip_space

__all__ = ["array_calls", "block_stop", "json_block"]


def block_stop(text: str, pos: int, find: Next) -> int:
    """Where a block that cannot be read from `pos` on ends: at its closing tag, or at the next opening tag if that
    comes first, or at the end of the text."""
    ends = [i for i in (find(TOOL_CALL_CLOSE, pos), find(TOOL_CALL_OPEN, pos)) if i != -1]
    return min(ends, default=len(text))


def array_calls(text: str, start: int) -> list[ParsedToolCall]:
    """The calls of a JSON array that starts at `text[start]` and is known to decode: one per element."""
    calls: list[ParsedToolCall] = []
    pos = skip_space(text, start + 1)
    if text[pos] == "]":
        return [ToolCallError("empty array of tool calls", text[start : pos + 1])]
    while True:
        try:
            obj, end = DECODER.raw_decode(text, pos)  # an element of an array that passed the depth check
        except JSON_ERRORS as exc:  # only if this deeper call stack meets the recursion limit the array did not
            return [*calls, ToolCallError(f"invalid JSON in tool call: {reason(exc)}", text[pos:].strip())]
        calls.append(to_call(obj, text[pos:end]))
        pos = skip_space(text, end)
        if text[pos] != ",":  # "]": the decoder accepted the whole array
            return calls
        pos = skip_space(text, pos + 1)


def json_block(text: str, start: int, find: Next) -> tuple[list[ParsedToolCall], int]:
    """The calls of a `<tool_call>` block whose JSON body starts at `text[start]`, and where reading goes on.

    The body is read with a JSON decoder, so `}` or `</tool_call>` inside a string does not end it. A balanced body
    with no closing tag (cut by a stop string, or at the end of the text, or before the next block) is accepted.
    """
    try:
        obj, end = decode(text, start)
    except JSON_ERRORS as exc:
        stop = block_stop(text, start, find)
        raw = text[start:stop].strip()
        if not raw:
            detail = "empty tool call"
        elif isinstance(exc, json.JSONDecodeError):
            detail = f"invalid JSON in tool call: {exc.msg} at offset {exc.pos - start}"
        else:
            detail = f"invalid JSON in tool call: {reason(exc)}"
        return [ToolCallError(detail, raw)], stop
    raw = text[start:end]
    rest = skip_blank(text, end)
    closed = text.startswith(TOOL_CALL_CLOSE, rest)
    if closed or rest >= len(text) or text.startswith(TOOL_CALL_OPEN, rest):
        calls = array_calls(text, start) if isinstance(obj, list) else [to_call(obj, raw)]
        return calls, rest + (len(TOOL_CALL_CLOSE) if closed else 0)
    return [ToolCallError(f"unexpected text after the tool call JSON: {text[rest : rest + 20]!r}", raw)], rest
