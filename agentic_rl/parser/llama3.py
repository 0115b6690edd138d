"""The Llama 3.x JSON form (`LLAMA3_JSON`: Llama 3.1, 3.2, 3.3): the assistant message is the call::

    {"name": "calculator", "parameters": {"expression": "2 + 3"}}

optionally after the `<|python_tag|>` special token, several calls one after another (separated by `;` and/or
whitespace; `"arguments"` is read as an alias of `"parameters"`).

A JSON final answer is told apart from a call this way:

- Without `<|python_tag|>`, a message is a call only when its answer (the text after any leading reasoning and
  whitespace) is entirely one or more JSON objects, each with a non-empty string `"name"` and a `"parameters"` (or
  `"arguments"`) key, separated by `;` and/or whitespace. Anything else is a final answer: JSON without those keys,
  JSON that does not decode, text before or after the JSON, one object among them that is not a call.
- After `<|python_tag|>` (outside reasoning; text may come before it) the model meant a call: the JSON objects that
  follow are the calls (each read as a `<tool_call>` JSON object is), read until text that does not start another
  object (which is not read); no object there, or JSON that does not decode, is a `ToolCallError`. Llama 3.1's
  built-in tool syntax (`<|python_tag|>brave_search.call(query="...")`) is such an error.

The bare form is read only when the caller names this format (`call_format=LLAMA3_JSON`): under other templates a
JSON answer stays an answer.
"""

from __future__ import annotations

from typing import Any

from agentic_rl.parser.calls import (
    PYTHON_TAG,
    THINK_CLOSE,
    THINK_OPEN,
    ParsedToolCall,
    ToolCallError,
    next_call_marker,
    to_call,
)
from agentic_rl.parser.json_text import JSON_ERRORS, Next, decode, reason, skip_blank

__all__ = ["answer_start", "message_calls", "tagged_block"]


def answer_start(text: str, find: Next | None = None) -> int:
    """Where the answer of a turn begins: after reasoning the generation prompt opened (everything before a
    `</think>` that no `<think>` precedes), after leading `<think>...</think>` blocks and whitespace; -1 when the
    turn ends inside reasoning. (`find`: the text's marker search, when the caller has one.)"""
    find = find or Next(text)
    pos = 0
    close, think = find(THINK_CLOSE, 0), find(THINK_OPEN, 0)
    if close >= 0 and (think < 0 or think > close):
        pos = close + len(THINK_CLOSE)
    while True:
        pos = skip_blank(text, pos)
        if not text.startswith(THINK_OPEN, pos):
            return pos
        end = find(THINK_CLOSE, pos + len(THINK_OPEN))
        if end < 0:
            return -1
        pos = end + len(THINK_CLOSE)


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos] == ";" or text[pos].isspace()):
        pos += 1
    return pos


def _is_call(obj: Any) -> bool:
    if not isinstance(obj, dict) or not ("parameters" in obj or "arguments" in obj):
        return False
    name = obj.get("name")
    return isinstance(name, str) and bool(name.strip())


def message_calls(text: str) -> tuple[int, list[ParsedToolCall]] | None:
    """The calls of a turn written in the bare form, and where they begin; None when the turn is not one (a final
    answer, see the module docstring). Never raises."""
    body = answer_start(text, Next(text))
    if body < 0 or not text.startswith("{", body):
        return None
    calls: list[ParsedToolCall] = []
    pos = body
    while pos < len(text):
        if text[pos] != "{":
            return None
        try:
            obj, end = decode(text, pos)
        except JSON_ERRORS:
            return None
        if not _is_call(obj):
            return None
        calls.append(to_call(obj, text[pos:end]))
        pos = _skip_separators(text, end)
    return body, calls


def tagged_block(text: str, start: int, find: Next) -> tuple[list[ParsedToolCall], int]:
    """The calls after the `<|python_tag|>` at `text[start]`, and where reading goes on (see the module docstring).
    Never raises."""
    pos = skip_blank(text, start + len(PYTHON_TAG))
    calls: list[ParsedToolCall] = []
    while True:
        if not text.startswith("{", pos):
            if calls:
                return calls, pos
            stop = next_call_marker(text, pos, find)
            raw = text[pos:stop].strip()
            detail = f"a tool call after {PYTHON_TAG} must be a JSON object: {raw[:20]!r}" if raw else "empty tool call"
            return [ToolCallError(detail, raw)], stop
        try:
            obj, end = decode(text, pos)
        except JSON_ERRORS as exc:
            stop = next_call_marker(text, pos + 1, find)
            return [*calls, ToolCallError(f"invalid JSON in tool call: {reason(exc)}", text[pos:stop].strip())], stop
        calls.append(to_call(obj, text[pos:end]))
        pos = _skip_separators(text, end)
