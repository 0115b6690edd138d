"""JSON inside model text, read safely: nesting bounded before decoding, every decoder error caught by the caller.

Nesting is bounded before decoding, by `json_nesting_exceeds`, not by the decoder running into the interpreter's
recursion limit: that limit is process-wide state that libraries raise (then 1,000 nested brackets decoded in one
process and failed in another), and past it the C decoder's recursion can overflow the thread's stack. `Next`
searches every marker once over the text, so that reading is linear in the text whatever it holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "DECODER",
    "JSON_ERRORS",
    "MAX_JSON_DEPTH",
    "Next",
    "TooDeep",
    "decode",
    "json_nesting_exceeds",
    "loads",
    "reason",
    "skip_blank",
    "skip_space",
]

MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are refused unread (a tool call's JSON here, a request body in the
server). Tool arguments nest a few levels; 64 leaves room for any real schema, far below the recursion limit."""

DECODER = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"
# Everything the JSON decoder raises on bad input: `JSONDecodeError` (a `ValueError`), `ValueError` for an integer
# literal past Python's digit limit, `RecursionError` should the stack already be deep when it decodes.
JSON_ERRORS = (ValueError, RecursionError)
_TOO_DEEP = f"nested too deeply (more than {MAX_JSON_DEPTH} levels)"
# JSON text as consecutive tokens: a run of other characters, a string (its closing quote optional, so that an
# unterminated one is a single token and nothing is scanned twice; possessive, so the regex engine keeps no
# backtracking state per escape), or one bracket. Linear in the text, constant memory.
_NESTING_TOKENS = re.compile(r'[^"\[\]{}]+|"(?:[^"\\]+|\\.)*+"?|[\[\]{}]', re.DOTALL)
# A character JSON allows outside strings in no value: the value ends there (the decoder then fails), so the scan
# can stop. Keeps the scan of a tool call in prose short.
_NOT_JSON = re.compile(r"[^ \t\n\r0-9+\-.eE,:truefalsn]")
# The characters a JSON value can start with (Python's decoder also reads NaN and Infinity).
_VALUE_START = '{["-0123456789tfnNI'


class TooDeep(ValueError):
    """JSON nested more than `MAX_JSON_DEPTH` levels deep (raised before decoding)."""


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


def decode(text: str, pos: int) -> tuple[Any, int]:
    """`raw_decode` of the value at `text[pos]`, refusing nesting past `MAX_JSON_DEPTH` before it decodes.

    Text where no value can start (nor an object's first key, an array's first element) is refused without the
    decoder, whose error would count the lines of the whole text before `pos`: a text of many such markers (a
    model repeating `[TOOL_CALLS]` or `<tool_call>`) stays linear to read.

    Raises:
        ValueError, RecursionError (`JSON_ERRORS`): for text that is not JSON (a `json.JSONDecodeError`), or nests
            too deeply (`TooDeep`).
    """
    at = _not_a_value(text, pos)
    if at >= 0:
        error = json.JSONDecodeError("Expecting value", "", 0)  # no line count over the text before it
        error.doc, error.pos = text, at
        raise error
    if json_nesting_exceeds(text, pos):
        raise TooDeep(_TOO_DEEP)
    return DECODER.raw_decode(text, pos)


def _not_a_value(text: str, pos: int) -> int:
    """Where the JSON at `text[pos]` visibly goes wrong in its first characters (no value, no first key or
    element); -1 when it may be JSON."""
    if pos >= len(text) or text[pos] not in _VALUE_START:
        return pos
    if text[pos] in "[{":
        inner = skip_space(text, pos + 1)
        allowed = '"}' if text[pos] == "{" else _VALUE_START + "]"
        if inner < len(text) and text[inner] not in allowed:
            return inner
    return -1


def loads(text: str) -> Any:
    """`json.loads`, refusing nesting past `MAX_JSON_DEPTH` before it decodes (raises as `decode` does)."""
    if json_nesting_exceeds(text):
        raise TooDeep(_TOO_DEEP)
    return json.loads(text)


def reason(exc: BaseException) -> str:
    """What was wrong with JSON the decoder refused, for the model."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, (RecursionError, TooDeep)):
        return _TOO_DEEP
    return str(exc).split(";")[0]  # e.g. an integer past Python's digit limit, without the advice for programmers


def skip_space(text: str, pos: int) -> int:
    """The index of the first character at or after `pos` that is not JSON whitespace."""
    while pos < len(text) and text[pos] in _JSON_SPACE:
        pos += 1
    return pos


def skip_blank(text: str, pos: int) -> int:
    """The index of the first character at or after `pos` that is not whitespace."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class Next:
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
