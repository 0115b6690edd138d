"""Assistant text -> ordered tool calls, in the tool-call formats of the model families people train.

Both formats are read inside the `<tool_call>` wrapper, whatever the model's chat template teaches:

Hermes / Qwen2.5 / Qwen3 (`HERMES`): a JSON object, or a JSON array of them (one call per element)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

Qwen3-Coder / Qwen3.5 (`QWEN3_CODER`): XML, one tag per parameter (several `<function=...>` blocks in one
`<tool_call>` are several calls)::

    <tool_call>
    <function=calculator>
    <parameter=expression>
    2 + 3
    </parameter>
    </function>
    </tool_call>

XML parameter values are text (without the one newline after the opening and before the closing tag). Given the
tools' JSON schemas, a value is converted to the type its schema names (integer, number, boolean, object, array,
null) when the text reads as that type, and is kept as a string otherwise. `tool_call_format` names the format a
chat template teaches; it decides how a call is written back into text (`format_tool_call`), never how it is read.

Reasoning is not acted on: a `<tool_call>` inside `<think>...</think>`, or inside a `<think>` left open at the end
of a cut turn, is a sketch, not a call. A `</think>` with no `<think>` before it ends reasoning that began before
the text (a template that opens `<think>` in the generation prompt): everything before it is reasoning.

Pure functions: no engine, no I/O. Malformed calls are returned as `ToolCallError` items so the environment can answer
them with error text; nothing here raises on model output (JSON the decoder refuses, nested more than
`MAX_JSON_DEPTH` levels deep or holding an integer too long to convert, is a `ToolCallError` too). A call whose
arguments are not a JSON object (a string that is not one, a list, a number) stays a `ToolCall` holding what the model
wrote, with the reason in `arguments_error`: the environment answers with what the tool expected, the server returns
the call (as vLLM does).

Nesting is bounded before decoding, by `json_nesting_exceeds`, not by the decoder running into the interpreter's
recursion limit: that limit is process-wide state that libraries raise (then 1,000 nested brackets decoded in one
process and failed in another), and past it the C decoder's recursion can overflow the thread's stack. Every marker
is searched for once over the text (`_Next`), so reading is linear in the text whatever it holds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HERMES",
    "MAX_JSON_DEPTH",
    "QWEN3_CODER",
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_FORMATS",
    "TOOL_CALL_OPEN",
    "action_text",
    "find_tool_calls",
    "format_tool_call",
    "ParsedToolCall",
    "ToolCall",
    "ToolCallError",
    "json_nesting_exceeds",
    "parse_tool_calls",
    "split_thought",
    "strip_thoughts",
    "tool_call_format",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"

HERMES = "hermes"
"""JSON inside `<tool_call>` (Hermes, Qwen2.5, Qwen3, and the tool system prompt of templates without tools)."""
QWEN3_CODER = "qwen3_coder"
"""`<function=NAME><parameter=KEY>value</parameter></function>` inside `<tool_call>` (Qwen3-Coder, Qwen3.5)."""
TOOL_CALL_FORMATS = (HERMES, QWEN3_CODER)

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
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)\s*", re.DOTALL)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NOT_CONVERTED = object()


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


class _Next:
    """Where each marker next occurs at or after a position, for positions that only move forward: each marker is
    searched for once over the text, so reading a text is linear in its length whatever it holds."""

    __slots__ = ("text", "_found")

    def __init__(self, text: str) -> None:
        self.text = text
        self._found: dict[str, tuple[int, int]] = {}  # marker -> (searched from, found at or -1)

    def __call__(self, marker: str, pos: int) -> int:
        found = self._found.get(marker)
        if found is not None and found[0] <= pos and (found[1] >= pos or found[1] < 0):
            return found[1]
        at = self.text.find(marker, pos)
        self._found[marker] = (pos, at)
        return at


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call: a tool's name and its arguments.

    Attributes:
        name: the tool's name (stripped).
        arguments: the arguments, a JSON object (dict); when the model wrote something else (a string that is not a
            JSON object, a list, a number), that value as written, and `arguments_error` says so.
        raw: the call's text (its JSON object, or its `<function=...>` block).
        arguments_error: why `arguments` is not a JSON object, meant for the model; "" when it is one.
    """

    name: str
    arguments: Any
    raw: str
    arguments_error: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """A tool call the model attempted but wrote wrongly; `message` is meant for the model."""

    message: str
    raw: str


ParsedToolCall = ToolCall | ToolCallError


# ---- the JSON form ----------------------------------------------------------------------------------------------


def _to_call(obj: Any, raw: str) -> ParsedToolCall:
    """The call a decoded JSON value stands for: `{"name": ..., "arguments": ...}` ("parameters" is an alias)."""
    if not isinstance(obj, dict):
        return ToolCallError(f"a tool call must be a JSON object, got {type(obj).__name__}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError('a tool call needs a "name" string', raw)
    name = name.strip()
    arguments = obj.get("arguments", obj.get("parameters"))
    value = arguments
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            value = _loads(arguments) if arguments.strip() else None
        except _JSON_ERRORS as exc:
            return ToolCall(
                name, arguments, raw, f'"arguments" of {name!r} is a string that is not valid JSON: {_reason(exc)}'
            )
    if value is None:  # none given, null, or an empty string: no arguments
        return ToolCall(name, {}, raw)
    if not isinstance(value, dict):
        return ToolCall(
            name, arguments, raw, f'"arguments" of {name!r} must be a JSON object, got {type(value).__name__}'
        )
    return ToolCall(name, value, raw)


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


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _block_stop(text: str, pos: int, find: _Next) -> int:
    """Where a block that cannot be read from `pos` on ends: at its closing tag, or at the next opening tag if that
    comes first, or at the end of the text."""
    ends = [i for i in (find(TOOL_CALL_CLOSE, pos), find(TOOL_CALL_OPEN, pos)) if i != -1]
    return min(ends, default=len(text))


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


def _json_block(text: str, start: int, find: _Next) -> tuple[list[ParsedToolCall], int]:
    """The calls of a `<tool_call>` block whose JSON body starts at `text[start]`, and where reading goes on.

    The body is read with a JSON decoder, so `}` or `</tool_call>` inside a string does not end it. A balanced body
    with no closing tag (cut by a stop string, or at the end of the text, or before the next block) is accepted.
    """
    try:
        obj, end = _decode(text, start)
    except _JSON_ERRORS as exc:
        stop = _block_stop(text, start, find)
        raw = text[start:stop].strip()
        if not raw:
            detail = "empty tool call"
        elif isinstance(exc, json.JSONDecodeError):
            detail = f"invalid JSON in tool call: {exc.msg} at offset {exc.pos - start}"
        else:
            detail = f"invalid JSON in tool call: {_reason(exc)}"
        return [ToolCallError(detail, raw)], stop
    raw = text[start:end]
    rest = _skip_blank(text, end)
    closed = text.startswith(TOOL_CALL_CLOSE, rest)
    if closed or rest >= len(text) or text.startswith(TOOL_CALL_OPEN, rest):
        calls = _array_calls(text, start) if isinstance(obj, list) else [_to_call(obj, raw)]
        return calls, rest + (len(TOOL_CALL_CLOSE) if closed else 0)
    return [ToolCallError(f"unexpected text after the tool call JSON: {text[rest : rest + 20]!r}", raw)], rest


# ---- the XML form -----------------------------------------------------------------------------------------------


def _tag_name(text: str, start: int, opening: str, find: _Next) -> tuple[str, int]:
    """The NAME of a `<function=NAME>` / `<parameter=NAME>` tag at `text[start]` and the index after its `>`;
    ("", -1) when the tag has no `>` on its line or no name."""
    at = start + len(opening)
    end = find(">", at)
    name = text[at:end].strip() if end >= 0 else ""
    if not name or "\n" in name or "<" in name:
        return "", -1
    return name, end + 1


def _xml_parameter(text: str, start: int, find: _Next) -> tuple[str, str, int]:
    """The name and text value of the `<parameter=...>` at `text[start]`, and the index after it.

    The value ends at `</parameter>`, or (the tag left out) at the next parameter, the end of the function or the
    call, or the end of the text. One newline after the opening tag and one before the closing tag are the format's.
    """
    name, at = _tag_name(text, start, _PARAMETER_OPEN, find)
    if at < 0:
        return "", "", start
    ends = [find(marker, at) for marker in (_PARAMETER_CLOSE, _PARAMETER_OPEN, _FUNCTION_CLOSE, TOOL_CALL_CLOSE)]
    end = min((i for i in ends if i >= 0), default=len(text))
    value = text[at:end]
    value = value[1:] if value.startswith("\n") else value
    value = value[:-1] if value.endswith("\n") else value
    return name, value, end + (len(_PARAMETER_CLOSE) if text.startswith(_PARAMETER_CLOSE, end) else 0)


def _xml_function(text: str, start: int, tools: Any, find: _Next) -> tuple[ParsedToolCall, int]:
    """The call of the `<function=...>` block at `text[start]`, and the index after it (for an error: where the
    block of calls stops). A block cut before `</function>` is accepted."""
    name, pos = _tag_name(text, start, _FUNCTION_OPEN, find)
    problem = "a tool call needs a function name: <function=NAME>" if pos < 0 else ""
    arguments: dict[str, str] = {}
    while not problem:
        pos = _skip_blank(text, pos)
        if text.startswith(_PARAMETER_OPEN, pos):
            key, value, end = _xml_parameter(text, pos, find)
            if not key:
                problem = f"a parameter of {name!r} needs a name: <parameter=NAME>"
            elif key in arguments:
                problem = f"parameter {key!r} of {name!r} is given twice"
            arguments[key] = value
            pos = end
        elif (
            text.startswith(_FUNCTION_CLOSE, pos)
            or pos >= len(text)
            or any(text.startswith(marker, pos) for marker in (TOOL_CALL_CLOSE, TOOL_CALL_OPEN, _FUNCTION_OPEN))
        ):
            end = pos + (len(_FUNCTION_CLOSE) if text.startswith(_FUNCTION_CLOSE, pos) else 0)
            properties = _properties(tools, name)
            typed = {key: _typed(value, properties.get(key)) for key, value in arguments.items()}
            return ToolCall(name, typed, text[start:end].strip()), end
        else:
            problem = f"unexpected text in the function block of {name!r}: {text[pos : pos + 20]!r}"
    stop = _block_stop(text, max(pos, start), find)
    return ToolCallError(problem, text[start:stop].strip()), stop


def _xml_block(text: str, start: int, tools: Any, find: _Next) -> tuple[list[ParsedToolCall], int]:
    """The calls of a `<tool_call>` block of `<function=...>` blocks starting at `text[start]`, and where reading
    goes on."""
    calls: list[ParsedToolCall] = []
    pos = start
    while text.startswith(_FUNCTION_OPEN, pos):
        call, pos = _xml_function(text, pos, tools, find)
        calls.append(call)
        if isinstance(call, ToolCallError):
            return calls, pos
        pos = _skip_blank(text, pos)
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
            decoded = _loads(text)
            if isinstance(decoded, dict if kind == "object" else list):
                return decoded
    except _JSON_ERRORS:  # not JSON, nested too deeply, or an integer past Python's digit limit
        pass
    return _NOT_CONVERTED


# ---- reading a turn ---------------------------------------------------------------------------------------------


def find_tool_calls(text: str, tools: Sequence[Mapping[str, Any]] | None = None) -> tuple[int, list[ParsedToolCall]]:
    """Where the tool calls of an assistant turn begin, and the calls, in order (reasoning skipped).

    Args:
        text: the assistant message content (any string: this never raises).
        tools: the tool schemas offered (OpenAI function tools); XML parameter values are converted to the types
            they give. None: XML values stay strings.

    Returns:
        (start, calls): the index in `text` of the first `<tool_call>` outside reasoning (-1 when there is none), and
        one `ToolCall` or `ToolCallError` per call: per JSON block, per element of a JSON array, per `<function=>`
        block. No entry means no tool call, i.e. a final answer.
    """
    find = _Next(text)
    start, calls, pos = -1, [], 0
    prompt_reasoning = True  # until a <think> opens, a </think> ends reasoning that began in the prompt
    while True:
        at, think = find(TOOL_CALL_OPEN, pos), find(THINK_OPEN, pos)
        close = find(THINK_CLOSE, pos) if prompt_reasoning else -1
        first = min((i for i in (at, think, close) if i >= 0), default=-1)
        if first < 0:
            return start, calls
        if first == at:
            body = _skip_blank(text, at + len(TOOL_CALL_OPEN))
            if text.startswith(_FUNCTION_OPEN, body):
                block, pos = _xml_block(text, body, tools, find)
            else:
                block, pos = _json_block(text, body, find)
            start = at if start < 0 else start
            calls.extend(block)
            continue
        prompt_reasoning = False
        if first == close:  # all so far was reasoning
            start, calls, pos = -1, [], close + len(THINK_CLOSE)
            continue
        end = find(THINK_CLOSE, think + len(THINK_OPEN))
        if end < 0:  # reasoning cut off: the rest of the turn
            return start, calls
        pos = end + len(THINK_CLOSE)


def parse_tool_calls(text: str, tools: Sequence[Mapping[str, Any]] | None = None) -> list[ParsedToolCall]:
    """Every tool call of `text` outside reasoning, in order (see `find_tool_calls`).

    Args:
        text: the assistant message content (any string: this never raises).
        tools: the tool schemas offered, for the types of XML parameter values (None: they stay strings).

    Returns:
        One `ToolCall` or `ToolCallError` per call; an empty list means no tool call, i.e. a final answer.
    """
    return find_tool_calls(text, tools)[1]


def _prompt_opened_close(text: str) -> int:
    """Where the `</think>` that closes reasoning the generation prompt opened starts: the first `</think>`, when no
    `<think>` comes before it; -1 if there is none."""
    close = text.find(THINK_CLOSE)
    return close if close >= 0 and text.find(THINK_OPEN, 0, close) < 0 else -1


def split_thought(text: str) -> tuple[str, str]:
    """Split reasoning from the rest of an assistant message.

    The reasoning is the first `<think>...</think>` block (an unclosed one runs to the end of the text), or, when a
    `</think>` comes before any `<think>`, the text before it (reasoning the generation prompt opened).

    Returns:
        (thought, remainder): the reasoning, stripped ("" if none), and the text outside it.
    """
    close = _prompt_opened_close(text)
    if close >= 0:
        return text[:close].strip(), text[close + len(THINK_CLOSE) :].strip()
    match = _THINK.search(text)
    if match is None:
        return "", text
    return match.group(1).strip(), (text[: match.start()] + text[match.end() :]).strip()


def strip_thoughts(text: str) -> str:
    """`text` without any reasoning: the text before a `</think>` that comes before any `<think>` (reasoning the
    generation prompt opened) and every `<think>` block (an unclosed one runs to the end) removed, each block
    replaced by a space (so `12<think>..</think>34` does not read `1234`); stripped."""
    close = _prompt_opened_close(text)
    if close >= 0:
        text = text[close + len(THINK_CLOSE) :]
    return _THINK_BLOCK.sub(" ", text).replace(THINK_CLOSE, " ").strip()  # and a stray closing tag


def action_text(content: str) -> str:
    """The tool-call part of an assistant turn (its text from the first `<tool_call>` outside reasoning on); "" for a
    final answer.

    What `Step.action` records, for the rollout and the server's capture alike.
    """
    at = find_tool_calls(content)[0]
    return content[at:] if at >= 0 else ""


# ---- formats ----------------------------------------------------------------------------------------------------


def tool_call_format(chat_template: Any) -> str:
    """The tool-call format a chat template teaches: `QWEN3_CODER` when it writes calls as `<function=NAME>` blocks
    (Qwen3-Coder, Qwen3.5), else `HERMES`.

    Args:
        chat_template: the template's source (a tokenizer's `chat_template`; None or a dict of named templates too).
    """
    return QWEN3_CODER if _FUNCTION_OPEN in str(chat_template or "") else HERMES


def format_tool_call(name: str, arguments: Any, call_format: str = HERMES, *, ensure_ascii: bool = False) -> str:
    """One `<tool_call>` block as a model of `call_format` writes it; `parse_tool_calls` reads it back as the call
    (XML values with the types their schema gives, when the schemas are passed).

    Args:
        name: the tool's name.
        arguments: its arguments (a JSON object; other values are written in the JSON form).
        call_format: `HERMES` or `QWEN3_CODER`.
        ensure_ascii: escape non-ASCII characters in JSON text.
    """
    if call_format == QWEN3_CODER and isinstance(arguments, Mapping):
        parameters = "".join(
            f"{_PARAMETER_OPEN}{key}>\n"
            f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=ensure_ascii)}\n{_PARAMETER_CLOSE}\n"
            for key, value in arguments.items()
        )
        return f"{TOOL_CALL_OPEN}\n{_FUNCTION_OPEN}{name}>\n{parameters}{_FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=ensure_ascii)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"
