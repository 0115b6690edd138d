"""Wire models of the OpenAI-compatible API: requests with validated fields, error bodies.

Field order follows OpenAI's; our extension fields are grouped after them. Every check names its field, and
`RequestError` carries the HTTP status so the HTTP layer maps it in one place.

Every field a request may carry is declared here: an unknown field is a 400 naming it. Real OpenAI fields that
do not change what is sampled are accepted and ignored (`IGNORED_FIELDS`); real OpenAI fields that would change
the output but are not implemented are a 400 unless they hold their neutral value (`UNSUPPORTED_FIELDS`). A
`null` stands for the field's default, as in OpenAI's API. The raw body is decoded and checked by `json_body`
(`parse_json` and `check_json` stay importable from here).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from agentic_rl.errors import ConfigError, RequestError
from agentic_rl.parser import MAX_JSON_DEPTH
from agentic_rl.server.json_body import check_json, parse_json

__all__ = [
    "DEFAULTABLE_FIELDS",
    "IGNORED_FIELDS",
    "MAX_JSON_DEPTH",
    "MAX_TOKENS_LIMIT",
    "REPORTED_DEFAULTS",
    "TRAJECTORY_HEADER",
    "UNSUPPORTED_FIELDS",
    "AllowedToolsChoice",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "FunctionTool",
    "JSONObjectFormat",
    "JSONSchemaFormat",
    "NamedToolChoice",
    "SamplingFields",
    "check_defaults",
    "check_json",
    "error_body",
    "omitted",
    "parse_json",
    "parse_request",
]

MAX_TOKENS_LIMIT = 64000
MAX_LOGPROBS = 20
TRAJECTORY_HEADER = "X-Trajectory-Id"

# Real OpenAI request fields that do not change what is sampled: accepted, and ignored.
IGNORED_FIELDS = (
    "metadata",
    "store",
    "user",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
)
# Real OpenAI request fields that would change the output and are not implemented: a 400 unless they hold the
# value given here (or null).
UNSUPPORTED_FIELDS: dict[str, dict[str, Any]] = {
    "chat": {
        "audio": None,
        "modalities": ["text"],
        "prediction": None,
        "web_search_options": None,
        "functions": None,
        "function_call": None,
        "reasoning_effort": None,
        "verbosity": None,
        "logit_bias": {},
    },
    "completion": {"echo": False, "best_of": 1, "suffix": None, "logit_bias": {}},
}

# Defaults a reply reports when its request leaves the field out: they differ from OpenAI's (which samples up to the
# model window, at temperature 1, without top-k), so a client may not expect them.
REPORTED_DEFAULTS = ("max_tokens", "temperature", "top_k")
# Fields a server may give other defaults (`agentic-rl serve --default KEY=VALUE`); `chat_template_kwargs` is chat's.
DEFAULTABLE_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "min_tokens",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "chat_template_kwargs",
)

# Strict: an int is a number, a string such as "0.5" or a bool is a 400, as in the OpenAI API.
_Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# apply_chat_template's own arguments: chat_template_kwargs may not override them.
_TEMPLATE_ARGUMENTS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def error_body(exc: RequestError) -> dict[str, Any]:
    """OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}


# ---- shared fields ---------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    """`stream_options`: `include_usage` adds a last chunk with the token counts; `include_obfuscation` is ignored."""

    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = None


class SamplingFields(_Strict):
    """Fields shared by both endpoints, with their defaults and allowed ranges."""

    model: StrictStr | None = None
    frequency_penalty: Annotated[_Float, Field(ge=-2.0, le=2.0)] = 0.0
    max_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS_LIMIT)] = 128
    n: Annotated[StrictInt, Field(ge=1, le=128)] = 1
    presence_penalty: Annotated[_Float, Field(ge=-2.0, le=2.0)] = 0.0
    seed: StrictInt | None = None  # any integer: folded into the engine's range (`engine.sampling.fold_seed`)
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[_Float, Field(ge=0.0, le=2.0)] = 0.2
    top_p: Annotated[_Float, Field(ge=1e-8, le=1.0)] = 1.0
    # Real OpenAI fields without an effect on sampling (IGNORED_FIELDS), and the neutral values of
    # UNSUPPORTED_FIELDS, are removed before validation.
    # --- extensions -------------------------------------------------------------------------------------------
    top_k: Annotated[StrictInt, Field(ge=0)] = 50
    min_p: Annotated[_Float, Field(ge=0.0, le=1.0)] = 0.0
    min_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS_LIMIT)] = 0
    repetition_penalty: Annotated[_Float, Field(gt=0.0, le=2.0)] = 1.0
    stop_token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=16)] | None = None
    detokenize: StrictBool = False
    trajectory_id: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = Field(
        default=None,
        description=f"Record this call token-exactly under this id (same as the {TRAJECTORY_HEADER} header).",
    )
    structured_outputs: dict[str, Any] | None = Field(
        default=None,
        description="vLLM structured-output constraint, e.g. {'regex': ...} or {'json': schema}.",
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _at_most_16_stops(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError(f"at most 16 stop strings, got {len(value)}")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_strings(self) -> list[str]:
        if not self.stop:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: Annotated[StrictStr, Field(min_length=1)]
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # --- extensions -------------------------------------------------------------------------------------------
    add_special_tokens: StrictBool = Field(
        default=True,
        description="Let the tokenizer add its special tokens (e.g. BOS) to the prompt; a BOS the text already "
        "starts with is not doubled.",
    )


# ---- chat ------------------------------------------------------------------------------------------------------


class FunctionCall(_Strict):
    name: Annotated[StrictStr, Field(min_length=1)]
    arguments: StrictStr
    parsed_arguments: Any = Field(default=None, exclude=True)  # the openai client's parsed copy: ignored


class ToolCall(_Strict):
    """An assistant message's tool call, as the server (or OpenAI) returned it.

    `index` (left by clients that assemble streamed calls) is ignored.
    """

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall
    index: StrictInt | None = Field(default=None, exclude=True)


class ChatMessage(_Strict):
    """One chat message. `developer` is the newer name of `system`.

    `content` is a string or a list of text parts (joined with newlines). It may be null only for an assistant
    message (e.g. one that carries `tool_calls`) and for a tool message; both are then rendered as "".
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    refusal: None = None
    function_call: None = None
    audio: None = None
    # Reasoning text that clients echo with an assistant message (verifiers always sends `reasoning_content`): this
    # server never returns reasoning, so only null is accepted.
    reasoning_content: None = None
    reasoning: None = None
    # Output fields that clients echo back with an assistant message they received: ignored.
    annotations: list[Any] | None = Field(default=None, exclude=True)
    parsed: Any = Field(default=None, exclude=True)

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list of content parts")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise ValueError(f"content part {i} is of type {kind!r}: only text parts are supported")
            if set(part) != {"type", "text"} or not isinstance(part["text"], str):
                raise ValueError(f"content part {i} must be {{'type': 'text', 'text': <string>}}")
            texts.append(part["text"])
        return "\n".join(texts)

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and self.role not in ("assistant", "tool"):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    @property
    def text(self) -> str:
        return self.content or ""

    def plain(self) -> dict[str, Any]:
        """The message as the rest of the server handles it: string content, `developer` as `system`."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump(exclude_none=True) for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class FunctionDefinition(_Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition

    def schema_dict(self) -> dict[str, Any]:
        """The tool as the chat template takes it (OpenAI's shape, nulls left out)."""
        return self.model_dump(exclude_none=True)

    @property
    def parameters(self) -> dict[str, Any]:
        return self.function.parameters if self.function.parameters is not None else {"type": "object"}


class _NamedFunction(_Strict):
    name: Annotated[StrictStr, Field(min_length=1)]


class NamedToolChoice(_Strict):
    """`{"type": "function", "function": {"name": ...}}`: call exactly this function."""

    type: Literal["function"]
    function: _NamedFunction


class _AllowedTools(_Strict):
    mode: Literal["auto", "required"]
    tools: Annotated[list[NamedToolChoice], Field(min_length=1)]


class AllowedToolsChoice(_Strict):
    """`{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`: `auto` or `required` over a subset."""

    type: Literal["allowed_tools"]
    allowed_tools: _AllowedTools


class JSONObjectFormat(_Strict):
    type: Literal["json_object"]


class _JSONSchema(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class JSONSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: _JSONSchema


class TextFormat(_Strict):
    type: Literal["text"]


def _one_of(value: Any, options: dict[str, type[BaseModel]]) -> Any:
    """Validate a `{"type": ...}` object against the model its `type` selects; errors name the inner field."""
    if isinstance(value, BaseModel):
        return value
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in options:
        raise ValueError(f"expected an object whose 'type' is one of {sorted(options)}, got {_shown(value)}")
    try:
        return options[kind].model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        what = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise ValueError(f"{where}: {what}") from None


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    parallel_tool_calls: StrictBool = True
    response_format: TextFormat | JSONObjectFormat | JSONSchemaFormat | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    # --- extensions -------------------------------------------------------------------------------------------
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="Extra variables for the chat template, e.g. {'enable_thinking': False}."
    )

    @model_validator(mode="before")
    @classmethod
    def _max_completion_tokens(cls, data: Any) -> Any:
        # OpenAI's chat API renamed `max_tokens` to `max_completion_tokens`; clients send either.
        if isinstance(data, dict) and "max_completion_tokens" in data:
            data = dict(data)
            value = data.pop("max_completion_tokens")
            if "max_tokens" in data and data["max_tokens"] != value:
                raise ValueError(f"max_tokens ({data['max_tokens']}) and max_completion_tokens ({value}) disagree")
            data["max_tokens"] = value
        return data

    @field_validator("response_format", mode="before")
    @classmethod
    def _response_format(cls, value: Any) -> Any:
        return _one_of(value, {"text": TextFormat, "json_object": JSONObjectFormat, "json_schema": JSONSchemaFormat})

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in ("none", "auto", "required"):
                raise ValueError(f"expected 'none', 'auto', 'required' or an object, got {value!r}")
            return value
        return _one_of(value, {"function": NamedToolChoice, "allowed_tools": AllowedToolsChoice})

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        clash = sorted(_TEMPLATE_ARGUMENTS & set(value or {}))
        if clash:
            raise ValueError(f"{clash[0]!r} is set by the server, not by chat_template_kwargs")
        return value

    def check(self) -> None:
        """Checks across fields.

        Raises:
            RequestError: naming the field at fault.
        """
        names = {tool.function.name for tool in self.tools or []}
        choice = self.tool_choice
        wanted: list[str] = []
        if isinstance(choice, NamedToolChoice):
            wanted = [choice.function.name]
        elif isinstance(choice, AllowedToolsChoice):
            wanted = [t.function.name for t in choice.allowed_tools.tools]
        elif choice == "required" and not names:
            raise RequestError("tool_choice 'required' needs tools", param="tool_choice")
        for name in wanted:
            if name not in names:
                raise RequestError(
                    f"tool_choice names {name!r}, which is not among the request's tools", param="tool_choice"
                )
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")

    @property
    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return [tool.schema_dict() for tool in self.tools] if self.tools else None


# ---- validation ------------------------------------------------------------------------------------------------

_REQUEST_KINDS: dict[type[SamplingFields], str] = {ChatCompletionRequest: "chat", CompletionRequest: "completion"}


def _prepared(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body without nulls (defaults), ignored fields and neutral values of unsupported fields.

    Raises:
        RequestError: for an unsupported field that holds a value other than its neutral one.
    """
    out: dict[str, Any] = {}
    unsupported = UNSUPPORTED_FIELDS[kind]
    for key, value in body.items():
        if value is None or key in IGNORED_FIELDS:
            continue
        if key in unsupported:
            if value == unsupported[key]:
                continue
            neutral = "" if unsupported[key] is None else f"{json.dumps(unsupported[key])} or "
            raise RequestError(
                f"'{key}' is an OpenAI field this server does not implement (it accepts only {neutral}null), "
                f"got {_shown(value)}",
                param=key,
            )
        out[key] = value
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def omitted(body: dict[str, Any], name: str) -> bool:
    """Whether a request body leaves the field `name` to its default: absent or null (for `max_tokens`, so is
    `max_completion_tokens`)."""
    names = (name, "max_completion_tokens") if name == "max_tokens" else (name,)
    return all(body.get(n) is None for n in names)


def check_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    """Validate a server's own defaults for fields requests leave out.

    Args:
        defaults: field name -> value, as a request would send it (e.g. `{"max_tokens": 1024}`).

    Returns:
        A copy of `defaults`.

    Raises:
        ConfigError: naming a key that is not in `DEFAULTABLE_FIELDS`, or the first value a request could not hold.
    """
    for key in defaults:
        if key not in DEFAULTABLE_FIELDS:
            raise ConfigError(f"no server default can be set for {key!r}; one of: {', '.join(DEFAULTABLE_FIELDS)}")
    try:
        parse_request(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], **defaults})
    except RequestError as exc:
        raise ConfigError(f"invalid server default: {exc}") from None
    return dict(defaults)


def parse_request(model: type[SamplingFields], body: Any, defaults: dict[str, Any] | None = None) -> SamplingFields:
    """Validate a request body.

    Args:
        model: `ChatCompletionRequest` or `CompletionRequest`.
        body: the decoded JSON body.
        defaults: the server's own defaults (`check_defaults`), taken for the fields the body leaves out.

    Raises:
        RequestError: 400 naming the first invalid field, its value and the rule.
    """
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    check_json(body)
    if defaults:
        body = {**body, **{k: v for k, v in defaults.items() if k in model.model_fields and omitted(body, k)}}
    try:
        request = model.model_validate(_prepared(_REQUEST_KINDS[model], body))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p))
        if err["type"] == "extra_forbidden":
            raise RequestError(f"unknown field '{loc}'", param=loc) from None
        if err["type"] == "missing":
            raise RequestError(f"'{loc}' is required", param=loc) from None
        message = err["msg"].removeprefix("Value error, ")
        raise RequestError(f"invalid '{loc}' ({_shown(err.get('input'))}): {message}", param=loc) from None
    if request.min_tokens > request.max_tokens:
        raise RequestError(
            f"min_tokens ({request.min_tokens}) must not exceed max_tokens ({request.max_tokens})", param="min_tokens"
        )
    if isinstance(request, ChatCompletionRequest):
        request.check()
    return request


def _is_union_tag(part: Any) -> bool:
    # pydantic names the union member it tried (`str`, `list[str]`, `NamedToolChoice`) in error locations.
    return isinstance(part, str) and (part == "str" or "[" in part or part[:1].isupper())
