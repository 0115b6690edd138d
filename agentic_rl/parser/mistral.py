"""Mistral's form (`MISTRAL`: Mistral Nemo, Mistral Small, ...): the `[TOOL_CALLS]` special token, then a JSON array
of calls, each with its id::

    [TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2 + 3"}, "id": "abcDEF123"}]

Its templates need ids of 9 alphanumeric characters (they raise on others); the id the model wrote is kept
(`ToolCall.id`). A single object instead of the array is one call. The newer form, one call per `[TOOL_CALLS]`
(`[TOOL_CALLS]calculator[ARGS]{"expression": "2 + 3"}`, or `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`), is read
too. `[TOOL_CALLS]` is read whatever the template (it is a special token of its own, not text an answer holds);
what follows it that is neither form, or JSON that does not decode, is a `ToolCallError`. Text after the calls is
not read.

`mistral_call_id` derives ids in Mistral's shape from any seed, deterministically, for calls written here.
"""

from __future__ import annotations

import hashlib
import re
import string

from agentic_rl.parser.calls import (
    MISTRAL_ARGS,
    MISTRAL_CALL_ID,
    MISTRAL_CALLS,
    ParsedToolCall,
    ToolCallError,
    next_call_marker,
    to_call,
)
from agentic_rl.parser.hermes import array_calls
from agentic_rl.parser.json_text import JSON_ERRORS, Next, decode, reason, skip_blank

__all__ = ["MISTRAL_ID_LENGTH", "is_mistral_call_id", "mistral_block", "mistral_call_id"]

MISTRAL_ID_LENGTH = 9
_ALPHABET = string.digits + string.ascii_letters
_ID = re.compile(f"[0-9A-Za-z]{{{MISTRAL_ID_LENGTH}}}")


def is_mistral_call_id(value: object) -> bool:
    """Whether `value` is an id Mistral's templates take: a string of 9 ASCII letters and digits."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def mistral_call_id(seed: object) -> str:
    """A 9-character alphanumeric call id derived from `seed` (its `str`): the first bytes of the SHA-256 of its
    UTF-8 text, in base 62. The same seed always gives the same id; different seeds give different ids but for
    hash collisions (62**9, about 1.4e16 ids)."""
    digest = hashlib.sha256(str(seed).encode("utf-8", "surrogatepass")).digest()
    number = int.from_bytes(digest[:8], "big")
    chars = []
    for _ in range(MISTRAL_ID_LENGTH):
        number, digit = divmod(number, len(_ALPHABET))
        chars.append(_ALPHABET[digit])
    return "".join(chars)


def mistral_block(text: str, start: int, find: Next) -> tuple[list[ParsedToolCall], int]:
    """The calls after the `[TOOL_CALLS]` at `text[start]`, and where reading goes on. Never raises."""
    body = skip_blank(text, start + len(MISTRAL_CALLS))
    if not text.startswith(("[", "{"), body) or text.startswith((MISTRAL_ARGS, MISTRAL_CALL_ID), body):
        return _named_call(text, body, find)
    try:
        obj, end = decode(text, body)
    except JSON_ERRORS as exc:
        stop = next_call_marker(text, body + 1, find)
        return [ToolCallError(f"invalid JSON in tool call: {reason(exc)}", text[body:stop].strip())], stop
    if isinstance(obj, list):
        return array_calls(text, body), end
    return [to_call(obj, text[body:end])], end


def _named_call(text: str, pos: int, find: Next) -> tuple[list[ParsedToolCall], int]:
    """The newer form's one call, `name[ARGS]{...}` or `name[CALL_ID]id[ARGS]{...}`, at `text[pos]`."""
    stop = next_call_marker(text, pos, find)
    args = find(MISTRAL_ARGS, pos)
    if args < 0 or args > stop:
        raw = text[pos:stop].strip()
        detail = (
            f"after {MISTRAL_CALLS} a tool call is a JSON array of calls or NAME{MISTRAL_ARGS}{{arguments}}"
            if raw
            else "empty tool call"
        )
        return [ToolCallError(detail, raw)], stop
    name, _, call_id = text[pos:args].partition(MISTRAL_CALL_ID)
    if not name.strip() or "\n" in name.strip():
        return [ToolCallError(f"a tool call needs a name before {MISTRAL_ARGS}", text[pos:stop].strip())], stop
    at = skip_blank(text, args + len(MISTRAL_ARGS))
    try:
        arguments, end = decode(text, at)
    except JSON_ERRORS as exc:
        detail = f"invalid JSON in the arguments of tool call {name.strip()!r}: {reason(exc)}"
        return [ToolCallError(detail, text[pos:stop].strip())], max(stop, at)
    call = {"name": name, "arguments": arguments, "id": call_id.strip()}
    return [to_call(call, text[pos:end])], end
