"""Request preparation: a request body validated into a `PreparedCall` the engine can run.

`RequestPreparer.prepare` checks the model name and the trajectory id, builds the exact prompt ids (a chat through
its chat template, continuing the trajectory's previous call when it can; a completion through the tokenizer),
and sets the sampling options and the output constraint. Every refusal is a `RequestError` naming its field.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError, RequestError
from agentic_rl.parser import tool_call_format
from agentic_rl.server.capture import TrajectoryRecorder
from agentic_rl.server.constraints import MAX_TOOL_CALLS, Constraint, output_constraint
from agentic_rl.server.protocol import (
    REPORTED_DEFAULTS,
    TRAJECTORY_HEADER,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    check_defaults,
    omitted,
    parse_request,
)

__all__ = ["PreparedCall", "RequestPreparer"]

logger = logging.getLogger(__name__)

_PASS_THROUGH = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "seed")
_MAX_RENDERERS = 16


@dataclass
class PreparedCall:
    """A validated request, ready for the engine.

    Attributes:
        request: the parsed request.
        prompt_ids: the exact prompt the engine will see.
        sampling: the engine's sampling options (output constraint included).
        trajectory_id: the capture id, or None.
        continued: True when `prompt_ids` extends the trajectory's previous call exactly.
        messages: the chat messages in plain form (None for completions).
        tools: the tool schemas the prompt was rendered with.
        constraint: the output constraint taken from `tool_choice` / `response_format` / `structured_outputs`.
        template_kwargs: `chat_template_kwargs` of the request.
        id: the response id (`chatcmpl-...` or `cmpl-...`).
        created: the response's creation time, in Unix seconds.
        weight_version: the engine's weight version when the call was prepared (recorded with a captured call).
        defaulted: the server defaults the call took for fields its request left out (those of `REPORTED_DEFAULTS`
            and those the server set), by field name.
        capture_problem: for a captured chat call whose template cannot be followed token-exactly through a tool
            loop, the reason (each such call then starts a new token run of its trajectory); else None.
        client: who sent the call (`HOST User-Agent` over HTTP), to warn each client once.
    """

    request: SamplingFields
    prompt_ids: list[int]
    sampling: SamplingConfig
    trajectory_id: str | None
    continued: bool
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    constraint: Constraint = field(default_factory=Constraint)
    template_kwargs: dict[str, Any] | None = None
    id: str = ""
    created: int = 0
    weight_version: int = 0
    defaulted: dict[str, Any] = field(default_factory=dict)
    capture_problem: str | None = None
    client: str = "in-process"

    @property
    def chat(self) -> bool:
        return isinstance(self.request, ChatCompletionRequest)


class RequestPreparer:
    """Turns request bodies into `PreparedCall`s for one engine and model.

    Args:
        engine: the engine the calls run on (its `max_model_len` bounds prompt plus completion, in tokens).
        tokenizer: the engine model's tokenizer.
        renderer: the chat renderer for requests without `chat_template_kwargs`.
        model_name: the only `model` a request may name (others get 404).
        recorder: the trajectory recorder that builds the prompts of tagged chat calls.
        max_tokens_cap: an upper bound on `max_tokens` (besides the model window), or None.
        max_tool_calls: the most tool calls a constrained turn may hold (`tool_choice="required"`, ...).
        defaults: the server's own defaults for fields requests leave out (`check_defaults`); other fields keep
            the request models' defaults.

    Raises:
        ConfigError: for an invalid `defaults` entry, or default `chat_template_kwargs` the template fails with.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        renderer: ChatRenderer,
        *,
        model_name: str,
        recorder: TrajectoryRecorder,
        max_tokens_cap: int | None = None,
        max_tool_calls: int = MAX_TOOL_CALLS,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.model_name = model_name
        self.recorder = recorder
        self.max_tokens_cap = max_tokens_cap
        if max_tool_calls < 1:
            raise ValueError(f"max_tool_calls must be at least 1, got {max_tool_calls}")
        self.max_tool_calls = max_tool_calls
        self._renderers: OrderedDict[str, ChatRenderer] = OrderedDict()
        self._lock = threading.Lock()  # calls are prepared in worker threads
        self._warned: set[str] = set()
        self.defaults = defaults or {}

    @property
    def defaults(self) -> dict[str, Any]:
        """The server's own defaults for fields requests leave out."""
        return self._defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        defaults = check_defaults(value)
        if defaults.get("chat_template_kwargs"):
            try:
                self._renderer(defaults["chat_template_kwargs"])
            except RequestError as exc:
                raise ConfigError(f"invalid default chat_template_kwargs: {exc}") from None
        self._defaults = defaults

    def prepare(
        self, body: Any, *, trajectory_id: str | None = None, chat: bool | None = None, streaming: bool | None = None
    ) -> PreparedCall:
        """Validate a request and build its prompt and sampling options.

        Args:
            body: the JSON body.
            trajectory_id: the `X-Trajectory-Id` header, if any.
            chat: True for `/v1/chat/completions`, False for `/v1/completions`, None to tell by `messages`/`prompt`.
            streaming: whether the caller can stream; False rejects `stream=true` (in-process calls), None allows it.

        Returns:
            The call, with a fresh `id` and `created` time.

        Raises:
            RequestError: for an invalid request (400) or an unknown model (404).
        """
        if chat is None:
            has_messages = isinstance(body, dict) and "messages" in body
            has_prompt = isinstance(body, dict) and "prompt" in body
            if has_messages == has_prompt:
                raise RequestError("the request needs exactly one of 'prompt' (completion) or 'messages' (chat)")
            chat = has_messages
        request = parse_request(ChatCompletionRequest if chat else CompletionRequest, body, self.defaults)
        if request.stream and streaming is False:
            raise RequestError(
                "stream=true is served over HTTP (or `OpenAIServing.stream`); this call returns one response",
                param="stream",
            )
        tid = self._trajectory_id(request, trajectory_id)
        if isinstance(request, ChatCompletionRequest):
            call = self._prepare_chat(request, tid)
        else:
            assert isinstance(request, CompletionRequest)
            call = self._prepare_completion(request, tid)
        call.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        call.created = int(time.time())
        names = dict.fromkeys((*REPORTED_DEFAULTS, *self.defaults))
        call.defaulted = {n: getattr(request, n) for n in names if hasattr(request, n) and omitted(body, n)}
        return call

    def _trajectory_id(self, request: SamplingFields, header_id: str | None) -> str | None:
        if request.model is not None and request.model != self.model_name:
            raise RequestError(
                f"model {request.model!r} does not exist; this server serves {self.model_name!r}",
                status=404,
                param="model",
                kind="not_found_error",
            )
        if header_id is not None and not 1 <= len(header_id) <= 256:
            raise RequestError(
                f"the {TRAJECTORY_HEADER} header must hold 1 to 256 characters, got {len(header_id)}",
                param="trajectory_id",
            )
        if header_id is not None and request.trajectory_id is not None and header_id != request.trajectory_id:
            raise RequestError(
                f"the {TRAJECTORY_HEADER} header ({header_id!r}) and the body's trajectory_id "
                f"({request.trajectory_id!r}) name different trajectories: give one, or the same id",
                param="trajectory_id",
            )
        tid = header_id if header_id is not None else request.trajectory_id
        if tid is not None and request.n != 1:
            raise RequestError("trajectory capture records one sample per call: use n=1", param="n")
        return tid

    def _renderer(self, template_kwargs: dict[str, Any] | None) -> ChatRenderer:
        """The renderer for these `chat_template_kwargs` (built on first use, the last few kept); one whose tool loop
        cannot be followed still renders prompts (`ChatRenderer(strict=False)`)."""
        if not template_kwargs:
            return self.renderer
        key = json.dumps(template_kwargs, sort_keys=True)
        with self._lock:
            renderer = self._renderers.get(key)
        if renderer is None:
            try:
                renderer = ChatRenderer(self.tokenizer, template_kwargs=template_kwargs, strict=False)
            except Exception as exc:
                raise RequestError(
                    f"the chat template fails with these chat_template_kwargs: {exc}", param="chat_template_kwargs"
                ) from None
        with self._lock:
            renderer = self._renderers.setdefault(key, renderer)
            self._renderers.move_to_end(key)
            while len(self._renderers) > _MAX_RENDERERS:
                self._renderers.popitem(last=False)
        return renderer

    def _capture_problem(self, renderer: ChatRenderer, tid: str | None) -> str | None:
        """For a captured call, why its template cannot be followed through a tool loop (warned once per template
        variables); None when it can, or for a call that is not captured."""
        problem = renderer.tool_loop_problem if tid is not None else None
        key = json.dumps(renderer.template_kwargs, sort_keys=True)
        if problem is not None and key not in self._warned:
            self._warned.add(key)
            logger.warning(
                "captured calls with chat_template_kwargs %s are not continued token by token, each starts "
                "a new token run of its trajectory: %s",
                key,
                problem,
            )
        return problem

    def _prepare_chat(self, request: ChatCompletionRequest, tid: str | None) -> PreparedCall:
        messages = [m.plain() for m in request.messages]
        tools = request.tool_dicts
        renderer = self._renderer(request.chat_template_kwargs)
        try:
            prompt_ids, continued = self.recorder.chat_prompt(
                tid, messages, tools, renderer=renderer, template_kwargs=request.chat_template_kwargs
            )
        except Exception as exc:  # the template refused these messages (e.g. roles out of the order it wants)
            raise RequestError(f"the chat template cannot render these messages: {exc}", param="messages") from None
        call_format = tool_call_format(renderer.tokenizer.chat_template)
        constraint = output_constraint(request, max_tool_calls=self.max_tool_calls, call_format=call_format)
        sampling = self._sampling(request, len(prompt_ids), [renderer.end_of_turn_id], constraint)
        return PreparedCall(
            request,
            prompt_ids,
            sampling,
            tid,
            continued,
            weight_version=self.engine.weight_version,
            messages=messages,
            tools=tools,
            constraint=constraint,
            template_kwargs=request.chat_template_kwargs,
            capture_problem=self._capture_problem(renderer, tid),
        )

    def _prepare_completion(self, request: CompletionRequest, tid: str | None) -> PreparedCall:
        prompt_ids = self.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        bos = self.tokenizer.bos_token_id
        if request.add_special_tokens and bos is not None and prompt_ids[:2] == [bos, bos]:
            plain = self.tokenizer.encode(request.prompt, add_special_tokens=False)
            if plain[:1] == [bos] and plain[:2] != [bos, bos]:  # the text already starts with the BOS
                prompt_ids = prompt_ids[1:]
        if not prompt_ids:
            raise RequestError("the prompt encodes to no tokens", param="prompt")
        continued = self.recorder.completion_continues(tid, prompt_ids)
        constraint = output_constraint(request)
        sampling = self._sampling(request, len(prompt_ids), [], constraint)
        return PreparedCall(
            request,
            prompt_ids,
            sampling,
            tid,
            continued,
            constraint=constraint,
            weight_version=self.engine.weight_version,
        )

    def _sampling(
        self, request: SamplingFields, prompt_len: int, stop_ids: list[int], constraint: Constraint
    ) -> SamplingConfig:
        room = self.engine.max_model_len - prompt_len
        if room < 1:
            raise RequestError(
                f"the prompt has {prompt_len} tokens; the model window (max_model_len) is "
                f"{self.engine.max_model_len}, which leaves no room for a completion",
                param="messages" if isinstance(request, ChatCompletionRequest) else "prompt",
            )
        vocabulary = len(self.tokenizer)
        if any(t >= vocabulary for t in request.stop_token_ids or []):
            raise RequestError(f"stop_token_ids must be below the vocabulary size {vocabulary}", param="stop_token_ids")
        max_tokens = min(request.max_tokens, room, self.max_tokens_cap or room)
        sampling: dict[str, Any] = {name: getattr(request, name) for name in _PASS_THROUGH}
        stops = request.stop_strings
        sampling.update(
            max_tokens=max_tokens,
            min_tokens=min(request.min_tokens, max_tokens),
            top_k=request.top_k if request.top_k > 0 else -1,
            logprobs=_top_n(request),
            detokenize=request.detokenize or None,  # None: the engine decides (only for stop strings)
            stop=stops or None,
            stop_token_ids=[*stop_ids, *(request.stop_token_ids or [])] or None,
            structured_outputs=constraint.params,
        )
        return SamplingConfig(**{k: v for k, v in sampling.items() if v is not None})


def _top_n(request: SamplingFields) -> int:
    """How many top logprobs per sampled token the request asks for (0 for none)."""
    if isinstance(request, ChatCompletionRequest):
        return (request.top_logprobs or 0) if request.logprobs else 0
    assert isinstance(request, CompletionRequest)
    return request.logprobs or 0
