"""Wire models of the OpenAI-compatible API: requests with validated sampling parameters, error bodies.

Field order follows OpenAI's; our extension fields are grouped after them. Every range check names its field, and
`RequestError` carries the HTTP status so the HTTP layer maps it in one place.
"""

from __future__ import annotations

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

from agentic_rl.errors import AgenticRLError

__all__ = [
    "MAX_TOKENS_LIMIT",
    "TRAJECTORY_HEADER",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "RequestError",
    "SamplingFields",
    "error_body",
    "parse_request",
]

MAX_TOKENS_LIMIT = 64000
MAX_LOGPROBS = 20
TRAJECTORY_HEADER = "X-Trajectory-Id"

_Float = Annotated[float, Field(strict=False, allow_inf_nan=False)]


class RequestError(AgenticRLError, ValueError):
    """A request the server rejects; `status` is the HTTP status, `param` the offending field."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind


def error_body(exc: RequestError) -> dict[str, Any]:
    """OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}


class SamplingFields(BaseModel):
    """Sampling parameters shared by both endpoints, with their defaults and allowed ranges."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] = 1
    max_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS_LIMIT)] = 128
    min_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS_LIMIT)] = 0
    temperature: Annotated[_Float, Field(ge=0.0, le=2.0)] = 0.2
    top_p: Annotated[_Float, Field(ge=1e-8, le=1.0)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=0)] = 50
    min_p: Annotated[_Float, Field(ge=0.0, le=1.0)] = 0.0
    frequency_penalty: Annotated[_Float, Field(ge=-2.0, le=2.0)] = 0.0
    presence_penalty: Annotated[_Float, Field(ge=-2.0, le=2.0)] = 0.0
    seed: Annotated[StrictInt, Field(ge=-65535, le=65535)] | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = 1
    detokenize: StrictBool = False
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    # --- extensions -------------------------------------------------------------------------------------------
    trajectory_id: StrictStr | None = Field(
        default=None,
        description=f"Record this call token-exactly under this id (same as the {TRAJECTORY_HEADER} header).",
    )
    structured_outputs: dict[str, Any] | None = Field(
        default=None,
        description="vLLM structured-output constraint, e.g. {'regex': ...} or {'json': schema}.",
    )

    @field_validator("logprobs", mode="before")
    @classmethod
    def _bool_logprobs(cls, value: Any) -> Any:
        # Chat clients send `logprobs: true/false` (with `top_logprobs`); completions send an int.
        if value is True:
            return 1
        if value is False:
            return 0
        return value


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: Annotated[StrictStr, Field(min_length=1)]


class ChatMessage(BaseModel):
    """One chat message. `content` may be null only for an assistant message that carries `tool_calls`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content == "" or (self.content is None and not (self.role == "assistant" and self.tool_calls)):
            raise ValueError("content must be a non-empty string")
        return self


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None

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


def parse_request(model: type[SamplingFields], body: Any) -> SamplingFields:
    """Validate a request body.

    Raises:
        RequestError: 400 naming the first invalid field, its value and the rule.
    """
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 80 else type(value).__name__
        raise RequestError(f"invalid '{loc}' ({shown}): {err['msg']}", param=loc) from exc
    if request.stream:
        raise RequestError("stream=true is not supported; send stream=false", param="stream")
    if request.min_tokens > request.max_tokens:
        raise RequestError(
            f"min_tokens ({request.min_tokens}) must not exceed max_tokens ({request.max_tokens})", param="min_tokens"
        )
    return request
