"""What reading a turn yields (`ToolCall`, `ToolCallError`), the markers and names of the tool-call formats, and the
one conversion of a decoded JSON object into a call that every JSON form shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentic_rl.parser.json_text import JSON_ERRORS, Next, loads, reason

__all__ = [
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "MISTRAL_ARGS",
    "MISTRAL_CALL_ID",
    "MISTRAL_CALLS",
    "PYTHON_TAG",
    "QWEN3_CODER",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_FORMATS",
    "TOOL_CALL_OPEN",
    "ParsedToolCall",
    "ToolCall",
    "ToolCallError",
    "next_call_marker",
    "to_call",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
PYTHON_TAG = "<|python_tag|>"
"""Llama 3.1's special token before a tool call."""
MISTRAL_CALLS = "[TOOL_CALLS]"
"""Mistral's special token before its tool calls."""
MISTRAL_ARGS = "[ARGS]"
"""Between a call's name and its arguments in Mistral's newer form (`[TOOL_CALLS]name[ARGS]{...}`)."""
MISTRAL_CALL_ID = "[CALL_ID]"
"""Between a call's name and its id in Mistral's newer form (`[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`)."""

HERMES = "hermes"
"""JSON inside `<tool_call>` (Hermes, Qwen2.5, Qwen3, and the tool system prompt of templates without tools)."""
QWEN3_CODER = "qwen3_coder"
"""`<function=NAME><parameter=KEY>value</parameter></function>` inside `<tool_call>` (Qwen3-Coder, Qwen3.5)."""
LLAMA3_JSON = "llama3_json"
"""The whole assistant message as `{"name": ..., "parameters": {...}}` objects, optionally after `<|python_tag|>`
(Llama 3.1, 3.2, 3.3)."""
MISTRAL = "mistral"
"""`[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abcDEF123"}]` (Mistral Nemo, Mistral Small, ...)."""
TOOL_CALL_FORMATS = (HERMES, QWEN3_CODER, LLAMA3_JSON, MISTRAL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call: a tool's name and its arguments.

    Attributes:
        name: the tool's name (stripped).
        arguments: the arguments, a JSON object (dict); when the model wrote something else (a string that is not a
            JSON object, a list, a number), that value as written, and `arguments_error` says so.
        raw: the call's text (its JSON object, or its `<function=...>` block).
        arguments_error: why `arguments` is not a JSON object, meant for the model; "" when it is one.
        id: the id the model wrote for the call (Mistral's `"id"`, 9 alphanumeric characters in its own format);
            "" in formats without ids.
    """

    name: str
    arguments: Any
    raw: str
    arguments_error: str = ""
    id: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """A tool call the model attempted but wrote wrongly; `message` is meant for the model."""

    message: str
    raw: str


ParsedToolCall = ToolCall | ToolCallError


def to_call(obj: Any, raw: str) -> ParsedToolCall:
    """The call a decoded JSON value stands for: `{"name": ..., "arguments": ...}` ("parameters" is an alias; a
    string `"id"` is kept). Never raises."""
    if not isinstance(obj, dict):
        return ToolCallError(f"a tool call must be a JSON object, got {type(obj).__name__}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError('a tool call needs a "name" string', raw)
    name = name.strip()
    call_id = obj.get("id")
    call_id = call_id if isinstance(call_id, str) else ""
    arguments = obj.get("arguments", obj.get("parameters"))
    value = arguments
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            value = loads(arguments) if arguments.strip() else None
        except JSON_ERRORS as exc:
            problem = f'"arguments" of {name!r} is a string that is not valid JSON: {reason(exc)}'
            return ToolCall(name, arguments, raw, problem, call_id)
    if value is None:  # none given, null, or an empty string: no arguments
        return ToolCall(name, {}, raw, "", call_id)
    if not isinstance(value, dict):
        problem = f'"arguments" of {name!r} must be a JSON object, got {type(value).__name__}'
        return ToolCall(name, arguments, raw, problem, call_id)
    return ToolCall(name, value, raw, "", call_id)


def next_call_marker(text: str, pos: int, find: Next) -> int:
    """Where the next `<tool_call>`, `[TOOL_CALLS]` or `<|python_tag|>` at or after `pos` begins (the end of the
    text when none does): where a call written wrongly stops."""
    found = [i for i in (find(TOOL_CALL_OPEN, pos), find(MISTRAL_CALLS, pos), find(PYTHON_TAG, pos)) if i >= 0]
    return min(found, default=len(text))
