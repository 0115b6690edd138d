"""The XML form inside `<tool_call>` (`QWEN3_CODER`: Qwen3-Coder, Qwen3.5): one tag per parameter (several
`<function=...>` blocks in one `<tool_call>` are several calls)::

    <tool_call>
    <function=calculator>
    <parameter=expression>
    2 + 3
    </parameter>
    </function>
    </tool_call>

XML parameter values are text (without the one newline after the opening and before the closing tag). Given the
tools' JSON schemas, a value is converted to the type its schema names (integer, number, boolean, object, array,
null) when the text reads as that type, and is kept as a string otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.parser.calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ParsedToolCall, ToolCall, ToolCallError
from agentic_rl.parser.hermes import block_stop
from agentic_rl.parser.json_text import JSON_ERRORS, Next, loads, skip_blank

__all__ = ["FUNCTION_CLOSE", "FUNCTION_OPEN", "PARAMETER_CLOSE", "PARAMETER_OPEN", "xml_block"]

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NOT_CONVERTED = object()


def _tag_name(text: str, start: int, opening: str, find: Next) -> tuple[str, int]:
    """The NAME of a `<function=NAME>` / `<parameter=NAME>` tag at `text[start]` and the index after its `>`;
    ("", -1) when the tag has no `>` on its line or no name."""
    at = start + len(opening)
    end = find(">", at)
    name = text[at:end].strip() if end >= 0 else ""
    if not name or "\n" in name or "<" in name:
        return "", -1
    return name, end + 1


def _xml_parameter(text: str, start: int, find: Next) -> tuple[str, str, int]:
    """The name and text value of the `<parameter=...>` at `text[start]`, and the index after it.

    The value ends at `</parameter>`, or (the tag left out) at the next parameter, the end of the function or the
    call, or the end of the text. One newline after the opening tag and one before the closing tag are the format's.
    """
    name, at = _tag_name(text, start, PARAMETER_OPEN, find)
    if at < 0:
        return "", "", start
    ends = [find(marker, at) for marker in (PARAMETER_CLOSE, PARAMETER_OPEN, FUNCTION_CLOSE, TOOL_CALL_CLOSE)]
    end = min((i for i in ends if i >= 0), default=len(text))
    value = text[at:end]
    value = value[1:] if value.startswith("\n") else value
    value = value[:-1] if value.endswith("\n") else value
    return name, value, end + (len(PARAMETER_CLOSE) if text.startswith(PARAMETER_CLOSE, end) else 0)


def _xml_function(text: str, start: int, tools: Any, find: Next) -> tuple[ParsedToolCall, int]:
    """The call of the `<function=...>` block at `text[start]`, and the index after it (for an error: where the
    block of calls stops). A block cut before `</function>` is accepted."""
    name, pos = _tag_name(text, start, FUNCTION_OPEN, find)
    problem = "a tool call needs a function name: <function=NAME>" if pos < 0 else ""
    arguments: dict[str, str] = {}
    while not problem:
        pos = skip_blank(text, pos)
        if text.startswith(PARAMETER_OPEN, pos):
            key, value, end = _xml_parameter(text, pos, find)
            if not key:
                problem = f"a parameter of {name!r} needs a name: <parameter=NAME>"
            elif key in arguments:
                problem = f"parameter {key!r} of {name!r} is given twice"
            arguments[key] = value
            pos = end
        elif (
            text.startswith(FUNCTION_CLOSE, pos)
            or pos >= len(text)
            or any(text.startswith(marker, pos) for marker in (TOOL_CALL_CLOSE, TOOL_CALL_OPEN, FUNCTION_OPEN))
        ):
            end = pos + (len(FUNCTION_CLOSE) if text.startswith(FUNCTION_CLOSE, pos) else 0)
            properties = _properties(tools, name)
            typed = {key: _typed(value, properties.get(key)) for key, value in arguments.items()}
            return ToolCall(name, typed, text[start:end].strip()), end
        else:
            problem = f"unexpected text in the function block of {name!r}: {text[pos : pos + 20]!r}"
    stop = block_stop(text, max(pos, start), find)
    return ToolCallError(problem, text[start:stop].strip()), stop


def xml_block(text: str, start: int, tools: Any, find: Next) -> tuple[list[ParsedToolCall], int]:
    """The calls of a `<tool_call>` block of `<function=...>` blocks starting at `text[start]`, and where reading
    goes on."""
    calls: list[ParsedToolCall] = []
    pos = start
    while text.startswith(FUNCTION_OPEN, pos):
        call, pos = _xml_function(text, pos, tools, find)
        calls.append(call)
        if isinstance(call, ToolCallError):
            return calls, pos
        pos = skip_blank(text, pos)
    if text.startswith(TOOL_CALL_CLOSE, pos):
        return calls, pos + len(TOOL_CALL_CLOSE)
    if pos < len(text) and not text.startswith(TOOL_CALL_OPEN, pos):
        calls[-1] = ToolCallError(f"unexpected text after the function block: {text[pos : pos + 20]!r}", calls[-1].raw)
    return calls, pos


def _properties(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any]:
    """The parameter `properties` of the tool named `name` in `tools` (OpenAI function tools or bare functions); {}
    when it is not there."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            return properties if isinstance(properties, Mapping) else {}
    return {}


def _typed(value: str, schema: Any) -> Any:
    """An XML parameter's text as the type its JSON schema names, when it reads as that type; else the text."""
    kinds = schema.get("type") if isinstance(schema, Mapping) else None
    kinds = (
        [kinds]
        if isinstance(kinds, str)
        else [k for k in kinds if isinstance(k, str)]
        if isinstance(kinds, list)
        else []
    )
    if not kinds or "string" in kinds:
        return value
    text = value.strip()
    if text == "null":
        return None
    for kind in kinds:
        converted = _as_kind(text, kind)
        if converted is not _NOT_CONVERTED:
            return converted
    return value


def _as_kind(text: str, kind: str) -> Any:
    """`text` read as a value of JSON schema type `kind`, or `_NOT_CONVERTED`."""
    try:
        if kind in ("integer", "number") and _INTEGER.fullmatch(text):
            return int(text)
        if kind == "number" and _NUMBER.fullmatch(text) and math.isfinite(float(text)):
            return float(text)
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind in ("object", "array"):
            decoded = loads(text)
            if isinstance(decoded, dict if kind == "object" else list):
                return decoded
    except JSON_ERRORS:  # not JSON, nested too deeply, or an integer past Python's digit limit
        pass
    return _NOT_CONVERTED
