"""Output constraints from `tool_choice`, `parallel_tool_calls` and `response_format`, enforced by the engine.

The model writes tool calls in the format its chat template teaches (`parser.tool_call_format`), which the server
parses back: Hermes / Qwen JSON (the default)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

Qwen3-Coder XML (`<tool_call>\n<function=NAME>\n<parameter=KEY>\nvalue\n</parameter>...`, values valid for the
schema through xgrammar's `qwen_xml` style), Llama 3's bare `{"name": NAME, "parameters": {...}}` objects (joined by
`"; "`; a constrained Llama 3 turn is either text or calls, never text then calls, since its templates read a
message with text before the JSON as an answer), or Mistral's `[TOOL_CALLS][{"name": NAME, "arguments": {...}, "id":
"abcDEF123"}]` (a 9-character id drawn by the engine). Markers are constrained as text: `[TOOL_CALLS]` is written
by the grammar in plain-text tokens, not as the Mistral tokenizer's control token.

Each constraint is a vLLM structured-output request (an xgrammar structural tag for tools, a JSON schema for
`response_format`), so the engine only samples tokens that keep the output valid; the ids are still sampled by
the engine, with their logprobs.

| `tool_choice`            | output                                                                            |
|--------------------------|-----------------------------------------------------------------------------------|
| `none`                   | text without `<tool_call>` (not parsed for calls)                                 |
| `auto` (default)         | free text; `parallel_tool_calls=false` or `allowed_tools`: text, then calls of    |
|                          | those tools with schema-valid arguments (at most one when parallel calls are off) |
| `required`               | only tool calls (one or more; exactly one when parallel calls are off)            |
| `{"type": "function"}`   | exactly one call of that function                                                 |

A constrained turn holds at most `max_tool_calls` calls (`MAX_TOOL_CALLS` unless configured; one when parallel calls
are off or a function is named), separated by newlines, and ends after its last call: the grammar then only allows
the end of the turn, so a model cannot write call after call until `max_tokens`. Under `auto` with parallel calls
the output is free and the count unbounded; a turn cut by `max_tokens` there (as anywhere) still answers with the
calls it completed (`ResponseBuilder.message`).

`tool_choice_outputs` gives the same constraint for an engine request made outside the server (a rollout's
`SamplingConfig.structured_outputs`), so that both paths can force tool calls with one grammar.

With `response_format` `json_object` / `json_schema`, the text is that JSON (under `auto`: that JSON, or tool
calls). Constrained JSON allows at most `MAX_JSON_WHITESPACE` whitespace characters in a row, so a model cannot spend
its whole budget on blanks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.parser import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_CALLS,
    PYTHON_TAG,
    QWEN3_CODER,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
)
from agentic_rl.server.protocol import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    FunctionTool,
    JSONObjectFormat,
    JSONSchemaFormat,
    NamedToolChoice,
    RequestError,
    SamplingFields,
    parse_request,
)
from agentic_rl.tools.schema import MAX_JSON_WHITESPACE, schema_problem

__all__ = ["MAX_TOOL_CALLS", "Constraint", "output_constraint", "tool_call_tag", "tool_choice_outputs"]

# Most tool calls in one constrained turn with parallel calls on: agents call a few tools at once, and a model that
# would repeat calls until `max_tokens` ends its turn here instead.
MAX_TOOL_CALLS = 8

# What separates the calls of one turn, per format (as the chat templates join rendered calls).
_SEPARATORS = {LLAMA3_JSON: "; ", MISTRAL: ", "}
# What comes before and after the calls of one turn, per format.
_AROUND = {MISTRAL: (MISTRAL_CALLS + "[", "]")}
# What `tool_choice="none"` keeps out of the text, per format (`<tool_call>` in every format).
_EXCLUDES = {LLAMA3_JSON: ['{"name"', PYTHON_TAG], MISTRAL: [MISTRAL_CALLS]}
_MISTRAL_ID = "[0-9A-Za-z]{9}"


@dataclass(frozen=True, slots=True)
class Constraint:
    """What a request asks of the output.

    Attributes:
        params: a `vllm.sampling_params.StructuredOutputsParams`, or None for free text.
        param: the request field the constraint comes from (named when the engine rejects it).
        parse_tools: whether the output is parsed for tool calls (chat with tools, `tool_choice` other than none).
    """

    params: Any = None
    param: str | None = None
    parse_tools: bool = False


def tool_call_tag(tool: FunctionTool, call_format: str = HERMES) -> dict[str, Any]:
    """The structural tag of one call of `tool` in `call_format` (`parser.TOOL_CALL_FORMATS`; another value is
    `HERMES`): its name fixed, its arguments valid for its parameter schema."""
    name = json.dumps(tool.function.name, ensure_ascii=False)
    if call_format == QWEN3_CODER:
        return {
            "type": "tag",
            "begin": f"{TOOL_CALL_OPEN}\n<function={tool.function.name}>\n",
            "content": {**_json_format(tool.parameters), "style": "qwen_xml"},
            "end": f"\n</function>\n{TOOL_CALL_CLOSE}",
        }
    if call_format == LLAMA3_JSON:
        return {
            "type": "tag",
            "begin": f'{{"name": {name}, "parameters": ',
            "content": _json_format(tool.parameters),
            "end": "}",
        }
    if call_format == MISTRAL:
        content = [_json_format(tool.parameters), _const(', "id": "'), {"type": "regex", "pattern": _MISTRAL_ID}]
        return {"type": "tag", "begin": f'{{"name": {name}, "arguments": ', "content": _sequence(content), "end": '"}'}
    return {
        "type": "tag",
        "begin": f'{TOOL_CALL_OPEN}\n{{"name": {name}, "arguments": ',
        "content": _json_format(tool.parameters),
        "end": f"}}\n{TOOL_CALL_CLOSE}",
    }


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _sequence(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def _json_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_JSON_WHITESPACE}


def _calls_only(tools: list[FunctionTool], *, most: int, call_format: str) -> dict[str, Any]:
    """One to `most` calls of `tools` in `call_format`, separated as its template joins them, and nothing else."""
    tags = [tool_call_tag(t, call_format) for t in tools]
    if call_format in _AROUND:
        opening, closing = _AROUND[call_format]
        calls = [_any_call(tags), *([_more_calls(tags, most - 1, call_format)] if most > 1 else [])]
        return _sequence([_const(opening), *calls, _const(closing)])
    if most == 1:
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": _SEPARATORS.get(call_format, "\n"),
            "at_least_one": True,
            "stop_after_first": True,
        }
    return {"type": "sequence", "elements": [_any_call(tags), _more_calls(tags, most - 1, call_format)]}


def _any_call(tags: list[dict[str, Any]]) -> dict[str, Any]:
    return tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}


def _more_calls(tags: list[dict[str, Any]], most: int, call_format: str) -> dict[str, Any]:
    """Up to `most` further calls, each after the format's separator."""
    call = _sequence([_const(_SEPARATORS.get(call_format, "\n")), _any_call(tags)])
    return {"type": "repeat", "min": 0, "max": most, "content": call}


def _text_then_calls(tools: list[FunctionTool], *, most: int, call_format: str) -> dict[str, Any]:
    """Free text, then optionally one to `most` calls of `tools` that end the turn; under `LLAMA3_JSON` (whose calls
    are the whole message) text without a call object, or the calls alone."""
    if call_format == LLAMA3_JSON:
        text = {"type": "any_text", "excludes": _excludes(call_format)}
        return {"type": "or", "elements": [_calls_only(tools, most=most, call_format=call_format), text]}
    if call_format == MISTRAL:
        calls = _calls_only(tools, most=most, call_format=call_format)["elements"][1:-1]
        tags = [{"type": "tag", "begin": MISTRAL_CALLS + "[", "content": _sequence(calls), "end": "]"}]
        trigger = MISTRAL_CALLS
    else:
        tags, trigger = [tool_call_tag(t, call_format) for t in tools], TOOL_CALL_OPEN
    first = {"type": "triggered_tags", "triggers": [trigger], "tags": tags, "stop_after_first": True}
    if most == 1 or call_format == MISTRAL:
        return first
    return {"type": "sequence", "elements": [first, _more_calls(tags, most - 1, call_format)]}


def _excludes(call_format: str) -> list[str]:
    return [TOOL_CALL_OPEN, *_EXCLUDES.get(call_format, [])]


def _tool_format(
    request: ChatCompletionRequest, json_schema: dict[str, Any] | None, max_tool_calls: int, call_format: str
) -> dict[str, Any] | None:
    """The structural-tag format for the request's tools and `tool_choice` in `call_format`, or None when the output
    is free."""
    tools = request.tools or []
    choice = request.tool_choice or ("auto" if tools else "none")
    most = max_tool_calls if request.parallel_tool_calls else 1
    if not tools or choice == "none":
        if json_schema is not None:
            return None  # the JSON constraint alone
        return {"type": "any_text", "excludes": _excludes(call_format)} if tools else None
    if isinstance(choice, NamedToolChoice):
        (tool,) = [t for t in tools if t.function.name == choice.function.name]
        return _calls_only([tool], most=1, call_format=call_format)
    mode = choice
    if isinstance(choice, AllowedToolsChoice):
        allowed = {t.function.name for t in choice.allowed_tools.tools}
        tools = [t for t in tools if t.function.name in allowed]
        mode = choice.allowed_tools.mode
    if mode == "required":
        return _calls_only(tools, most=most, call_format=call_format)
    if json_schema is not None:  # auto: the JSON answer, or calls
        return {
            "type": "or",
            "elements": [_json_format(json_schema), _calls_only(tools, most=most, call_format=call_format)],
        }
    if most == 1 or isinstance(choice, AllowedToolsChoice):
        return _text_then_calls(tools, most=most, call_format=call_format)
    return None


def _response_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    fmt = request.response_format
    if isinstance(fmt, JSONObjectFormat):
        return {"type": "object"}
    if isinstance(fmt, JSONSchemaFormat):
        return fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {"type": "object"}
    return None


def _structured_outputs(fields: dict[str, Any]) -> Any:
    """vLLM's `StructuredOutputsParams` from a request's `structured_outputs`: known fields, exactly one kind."""
    import dataclasses

    from vllm.sampling_params import StructuredOutputsParams

    known = [f.name for f in dataclasses.fields(StructuredOutputsParams) if not f.name.startswith("_")]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise RequestError(
            f"unknown field 'structured_outputs.{unknown[0]}'; known: {', '.join(known)}",
            param=f"structured_outputs.{unknown[0]}",
        )
    kinds = [k for k in _STRUCTURED_KINDS if fields.get(k) is not None]
    if len(kinds) != 1:
        raise RequestError(
            f"'structured_outputs' needs exactly one of {', '.join(_STRUCTURED_KINDS)}; got "
            f"{', '.join(kinds) or 'none'}",
            param="structured_outputs",
        )
    try:
        return StructuredOutputsParams(**fields)
    except Exception as exc:  # vLLM's own validation errors are not ValueErrors
        raise RequestError(f"invalid 'structured_outputs': {exc}", param="structured_outputs") from None


def _check_schema(schema: dict[str, Any], param: str) -> None:
    """A 400 naming `param` and xgrammar's reason when the engine could not build a grammar from `schema`
    (`tools.schema.schema_problem`)."""
    reason = schema_problem(schema)
    if reason is not None:
        raise RequestError(f"invalid JSON schema in '{param}': {reason}", param=param)


_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def output_constraint(
    request: SamplingFields, *, max_tool_calls: int = MAX_TOOL_CALLS, call_format: str = HERMES
) -> Constraint:
    """The constraint a request asks for.

    Args:
        request: the parsed request.
        max_tool_calls: the most calls a constrained turn may hold when parallel calls are on (at least 1).
        call_format: the tool-call format of the model's chat template (`parser.tool_call_format`): calls are
            constrained to it.

    Returns:
        The constraint (free text: `params` None).

    Raises:
        RequestError: for a malformed `structured_outputs`, or one combined with `tool_choice` / `response_format`.
        ValueError: if `max_tool_calls` is below 1.
    """
    from vllm.sampling_params import StructuredOutputsParams

    if max_tool_calls < 1:
        raise ValueError(f"max_tool_calls must be at least 1, got {max_tool_calls}")

    tool_format = json_schema = None
    parse_tools = False
    if isinstance(request, ChatCompletionRequest):
        json_schema = _response_schema(request)
        if json_schema is not None:
            _check_schema(json_schema, "response_format.json_schema.schema")
        for i, tool in enumerate(request.tools or []):
            _check_schema(tool.parameters, f"tools.{i}.function.parameters")
        tool_format = _tool_format(request, json_schema, max_tool_calls, call_format)
        parse_tools = bool(request.tools) and request.tool_choice != "none"
    if request.structured_outputs is not None:
        if tool_format is not None or json_schema is not None:
            raise RequestError(
                "structured_outputs cannot be combined with a constraining tool_choice, "
                "parallel_tool_calls=false or response_format",
                param="structured_outputs",
            )
        params = _structured_outputs(request.structured_outputs)
        return Constraint(params, "structured_outputs", parse_tools)
    if tool_format is None and json_schema is None:
        return Constraint(None, None, parse_tools)
    if tool_format is None:  # the JSON alone, with runs of whitespace bounded so that the JSON ends
        tool_format, param = _json_format(json_schema or {}), "response_format"
    else:
        param = "tools"
    tag = json.dumps({"type": "structural_tag", "format": tool_format}, ensure_ascii=False)
    return Constraint(StructuredOutputsParams(structural_tag=tag), param, parse_tools)


def tool_choice_outputs(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any = "required",
    *,
    parallel_tool_calls: bool = True,
    max_tool_calls: int = MAX_TOOL_CALLS,
    call_format: str = HERMES,
) -> Any:
    """The structured-outputs constraint of a chat request with `tools`, `tool_choice` and `parallel_tool_calls`.

    The same `vllm.sampling_params.StructuredOutputsParams` the server builds for such a request (no
    `response_format`), for engine requests made outside the server, e.g. a rollout's
    `SamplingConfig(structured_outputs=tool_choice_outputs(tools))`: every turn is then one to `max_tool_calls`
    schema-valid calls (exactly one with `parallel_tool_calls=False`), as `tool_choice="required"` makes them on the
    server.

    Args:
        tools: tool schemas in OpenAI's shape (`{"type": "function", "function": {"name", "parameters", ...}}`).
        tool_choice: `"none"`, `"auto"`, `"required"` or an OpenAI tool-choice object, as in a chat request.
        parallel_tool_calls: whether a turn may hold more than one call.
        max_tool_calls: the most calls a turn may hold when parallel calls are on.
        call_format: the tool-call format of the model's chat template (`parser.tool_call_format(
            renderer.tokenizer.chat_template)`), which the calls are written in.

    Returns:
        The constraint, or None where the request would leave the output free (`"auto"` with parallel calls).

    Raises:
        RequestError: for malformed tools or `tool_choice` (e.g. naming a tool not among `tools`), or a parameter
            schema the engine cannot build a grammar from.
        ValueError: if `max_tool_calls` is below 1.
    """
    body = {
        "messages": [{"role": "user", "content": ""}],
        "tools": [dict(t) for t in tools],
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel_tool_calls,
    }
    request = parse_request(ChatCompletionRequest, body)
    return output_constraint(request, max_tool_calls=max_tool_calls, call_format=call_format).params
