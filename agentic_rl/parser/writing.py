"""Which tool-call format a chat template teaches, and calls written in each format as its models write them.

`tool_call_format` decides how calls are written back into text (`format_tool_call`, `format_tool_calls`) and
which calls are read beyond the ones always read (`find_tool_calls(call_format=...)`: Llama 3's bare JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.parser.calls import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_CALLS,
    PYTHON_TAG,
    QWEN3_CODER,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)
from agentic_rl.parser.mistral import is_mistral_call_id, mistral_call_id
from agentic_rl.parser.qwen3_coder import FUNCTION_CLOSE, FUNCTION_OPEN, PARAMETER_CLOSE, PARAMETER_OPEN

__all__ = ["format_tool_call", "format_tool_calls", "tool_call_format"]

# How Llama 3's templates ask for a call (3.1, 3.2 and 3.3 alike), and how they write one.
_LLAMA3_MARKS = ('{"name": function name, "parameters"', "'\"parameters\": '")
# What separates the calls of one turn, per format.
_SEPARATORS = {HERMES: "\n", QWEN3_CODER: "\n", LLAMA3_JSON: "; ", MISTRAL: ", "}


def tool_call_format(chat_template: Any) -> str:
    """The tool-call format a chat template teaches.

    `QWEN3_CODER` when it writes calls as `<function=NAME>` blocks (Qwen3-Coder, Qwen3.5); `MISTRAL` when it writes
    `[TOOL_CALLS]`; `HERMES` when it writes `<tool_call>` (Hermes, Qwen2.5, Qwen3, Hermes-3 on Llama 3.1);
    `LLAMA3_JSON` when it writes `<|python_tag|>` or asks for / writes `"parameters"` objects as Llama 3.x's
    templates do; else `HERMES` (the format of the tool system prompt of templates without tools).

    Args:
        chat_template: the template's source (a tokenizer's `chat_template`; None or a dict of named templates too).
    """
    source = str(chat_template or "")
    if FUNCTION_OPEN in source:
        return QWEN3_CODER
    if MISTRAL_CALLS in source:
        return MISTRAL
    if TOOL_CALL_OPEN in source:
        return HERMES
    if PYTHON_TAG in source or any(mark in source for mark in _LLAMA3_MARKS):
        return LLAMA3_JSON
    return HERMES


def _json(value: Any, ensure_ascii: bool) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii)


def _one(name: str, arguments: Any, call_format: str, ensure_ascii: bool, call_id: str) -> str:
    """One call's own text: a `<tool_call>` block, a Llama 3 object, or a Mistral array element."""
    if call_format == QWEN3_CODER and isinstance(arguments, Mapping):
        parameters = "".join(
            f"{PARAMETER_OPEN}{key}>\n{value if isinstance(value, str) else _json(value, ensure_ascii)}\n"
            f"{PARAMETER_CLOSE}\n"
            for key, value in arguments.items()
        )
        return f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n{parameters}{FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"
    if call_format == LLAMA3_JSON:
        return _json({"name": name, "parameters": arguments}, ensure_ascii)
    if call_format == MISTRAL:  # as the template writes it: the function's JSON, then its id
        return _json({"name": name, "arguments": arguments}, ensure_ascii)[:-1] + f', "id": "{call_id}"}}'
    return f"{TOOL_CALL_OPEN}\n{_json({'name': name, 'arguments': arguments}, ensure_ascii)}\n{TOOL_CALL_CLOSE}"


def format_tool_calls(
    calls: Sequence[tuple[str, Any] | tuple[str, Any, str | None]],
    call_format: str = HERMES,
    *,
    ensure_ascii: bool = False,
) -> str:
    """The calls of one assistant turn as a model of `call_format` writes them; `parse_tool_calls(text,
    call_format=call_format)` reads them back as the same calls (XML values with the types their schema gives, when
    the schemas are passed).

    - `HERMES`: one `<tool_call>` block per call, a JSON `{"name", "arguments"}` object each, joined by newlines.
    - `QWEN3_CODER`: one `<tool_call><function=NAME><parameter=KEY>` block per call (arguments that are not an
      object are written in the JSON form), joined by newlines.
    - `LLAMA3_JSON`: `{"name": ..., "parameters": ...}` objects joined by `"; "` (the templates write one).
    - `MISTRAL`: `[TOOL_CALLS]` and one JSON array of `{"name", "arguments", "id"}` objects. An id that is not 9
      ASCII letters and digits (or none) is replaced by `mistral_call_id` of the given id, or of the call's position,
      name and arguments when none is given: deterministic.

    Args:
        calls: `(name, arguments)` or `(name, arguments, call_id)` per call; arguments are a JSON object (other
            JSON values are written as they are).
        call_format: one of `TOOL_CALL_FORMATS`; another value writes `HERMES`.
        ensure_ascii: escape non-ASCII characters in JSON text.

    Raises:
        TypeError: if arguments are not JSON-serializable.
    """
    texts = []
    for index, call in enumerate(calls):
        name, arguments = call[0], call[1]
        given = call[2] if len(call) > 2 else None
        call_id = ""
        if call_format == MISTRAL:
            seed = given if given else f"{index}\n{name}\n{json.dumps(arguments, sort_keys=True, default=str)}"
            call_id = given if is_mistral_call_id(given) else mistral_call_id(seed)
        texts.append(_one(name, arguments, call_format, ensure_ascii, call_id))
    joined = _SEPARATORS.get(call_format, "\n").join(texts)
    return f"{MISTRAL_CALLS}[{joined}]" if call_format == MISTRAL else joined


def format_tool_call(
    name: str, arguments: Any, call_format: str = HERMES, *, ensure_ascii: bool = False, call_id: str | None = None
) -> str:
    """One call as a model of `call_format` writes it (see `format_tool_calls`): a `<tool_call>` block (`HERMES`,
    `QWEN3_CODER`), a bare `{"name", "parameters"}` object (`LLAMA3_JSON`), or `[TOOL_CALLS][{..., "id": ...}]`
    (`MISTRAL`, with `call_id` when it is 9 alphanumeric characters, else an id derived from it or from the call).

    Raises:
        TypeError: if `arguments` are not JSON-serializable.
    """
    return format_tool_calls([(name, arguments, call_id)], call_format, ensure_ascii=ensure_ascii)
