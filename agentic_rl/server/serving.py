"""The logic behind the OpenAI-compatible endpoints, shared by HTTP routes and the in-process `completions`.

A request is first prepared (validated, its prompt ids built, its sampling options and output constraint set),
then answered either whole (`respond`) or as a stream of OpenAI chunks (`stream`). Both read the same sampled ids
and build the same message from them, so a streamed call is recorded exactly like a plain one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine, Generation, StreamingEngine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import read_turn
from agentic_rl.errors import EngineError, EngineRejectedError
from agentic_rl.parser import TOOL_CALL_OPEN, ToolCall, parse_tool_calls
from agentic_rl.server.capture import CapturedTurn, TrajectoryRecorder
from agentic_rl.server.constraints import Constraint, output_constraint
from agentic_rl.server.protocol import (
    TRAJECTORY_HEADER,
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    SamplingFields,
    parse_request,
)
from agentic_rl.server.tokens import TokenTexts

__all__ = ["ChunkStream", "OpenAIServing", "PreparedCall", "finite_logprobs"]

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

    @property
    def chat(self) -> bool:
        return isinstance(self.request, ChatCompletionRequest)


class ChunkStream:
    """The chunks of a streamed call; its first chunk is already computed (so errors surface before streaming)."""

    def __init__(self, first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> None:
        self._first: dict[str, Any] | None = first
        self._rest = rest

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        """Stop the call: aborts its engine requests."""
        await self._rest.aclose()  # type: ignore[attr-defined]


class _Choice:
    """One choice's sampled ids as they grow, and the text already sent for it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[dict[int, float]] = []
        self.sent = ""
        self.started = False
        self.final: Generation | None = None


class OpenAIServing:
    """Serves `/v1/completions` and `/v1/chat/completions` from one engine.

    Args:
        engine: the engine to sample from (one with `stream` streams token by token; others send one delta).
        tokenizer: the engine model's tokenizer (chat template, decoding).
        model_name: the name clients pass as `model` (others get 404); also listed by `/v1/models`.
        recorder: where calls tagged with a trajectory id are captured (one is created if None).
        max_tokens_cap: an upper bound on `max_tokens` (besides the model window).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model_name: str,
        recorder: TrajectoryRecorder | None = None,
        max_tokens_cap: int | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.model_name = model_name
        self.recorder = recorder or TrajectoryRecorder(self.renderer)
        self.max_tokens_cap = max_tokens_cap
        self.created = int(time.time())
        self.token_texts = TokenTexts(tokenizer)
        self._renderers: OrderedDict[str, ChatRenderer] = OrderedDict()

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                             "owned_by": "agentic_rl", "max_model_len": self.engine.max_model_len}]}  # fmt: skip

    # ---- entry points ---------------------------------------------------------------------------------------

    async def handle(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """Dispatch a request dict: `messages` -> chat completion, `prompt` -> completion.

        Raises:
            RequestError: for an invalid request (status 400) or an unknown model (404).
        """
        return await self.respond(self.prepare(body, trajectory_id=trajectory_id, streaming=False))

    async def completion(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """`POST /v1/completions` (not streamed)."""
        return await self.respond(self.prepare(body, trajectory_id=trajectory_id, chat=False, streaming=False))

    async def chat_completion(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """`POST /v1/chat/completions` (not streamed)."""
        return await self.respond(self.prepare(body, trajectory_id=trajectory_id, chat=True, streaming=False))

    def prepare(
        self, body: Any, *, trajectory_id: str | None = None, chat: bool | None = None, streaming: bool | None = None
    ) -> PreparedCall:
        """Validate a request and build its prompt and sampling options.

        Args:
            body: the JSON body.
            trajectory_id: the `X-Trajectory-Id` header, if any.
            chat: True for `/v1/chat/completions`, False for `/v1/completions`, None to tell by `messages`/`prompt`.
            streaming: whether the caller can stream; False rejects `stream=true` (in-process calls), None allows it.

        Raises:
            RequestError: for an invalid request (400) or an unknown model (404).
        """
        if chat is None:
            has_messages = isinstance(body, dict) and "messages" in body
            has_prompt = isinstance(body, dict) and "prompt" in body
            if has_messages == has_prompt:
                raise RequestError("the request needs exactly one of 'prompt' (completion) or 'messages' (chat)")
            chat = has_messages
        request = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
        if request.stream and streaming is False:
            raise RequestError("stream=true is served over HTTP (or `OpenAIServing.stream`); this call returns one "
                               "response", param="stream")  # fmt: skip
        tid = self._trajectory_id(request, trajectory_id)
        if isinstance(request, ChatCompletionRequest):
            call = self._prepare_chat(request, tid)
        else:
            assert isinstance(request, CompletionRequest)
            call = self._prepare_completion(request, tid)
        call.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        call.created = int(time.time())
        return call

    async def respond(self, call: PreparedCall) -> dict[str, Any]:
        """Run a prepared call and return the whole response (the call is recorded when tagged)."""
        generations = await self._generate(call)
        choices = []
        for i, gen in enumerate(generations):
            text = self._final_text(call, gen.token_ids, gen.finish_reason, gen.stop_reason)
            choice: dict[str, Any] = {"index": i}
            if call.chat:
                message, finish = self._message(call, text, gen.finish_reason)
                choice.update(message=message, finish_reason=finish,
                              logprobs=self._chat_logprobs(call, gen.token_ids, gen.logprobs, gen.top_logprobs))  # fmt: skip
            else:
                choice.update(text=text, finish_reason=gen.finish_reason,
                              logprobs=self._completion_logprobs(call, gen.token_ids, gen.logprobs, gen.top_logprobs))  # fmt: skip
            choice.update(token_ids=gen.token_ids, sampled_logprobs=finite_logprobs(gen.logprobs))
            choices.append(choice)
        body = {
            "id": call.id, "object": "chat.completion" if call.chat else "text_completion", "created": call.created,
            "model": self.model_name, "choices": choices, "usage": self._usage(call, [g.token_ids for g in generations]),
            "prompt_token_ids": call.prompt_ids,
        }  # fmt: skip
        if call.trajectory_id is not None:
            body["trajectory_id"] = call.trajectory_id
            self._record(call, generations[0], choices[0].get("message"), choices[0].get("text", ""))
        return body

    async def stream(self, call: PreparedCall) -> ChunkStream:
        """Start a prepared call as a stream of OpenAI chunks (ending before `[DONE]`, which HTTP adds).

        The first chunk is computed before this returns, so a request the engine rejects raises here.

        Raises:
            RequestError: if the engine rejects the request (400).
        """
        chunks = self._chunks(call)
        try:
            first = await chunks.__anext__()
        except BaseException:
            await chunks.aclose()
            raise
        return ChunkStream(first, chunks)

    # ---- preparing ------------------------------------------------------------------------------------------

    def _trajectory_id(self, request: SamplingFields, header_id: str | None) -> str | None:
        if request.model is not None and request.model != self.model_name:
            raise RequestError(f"model {request.model!r} does not exist; this server serves {self.model_name!r}",
                               status=404, param="model", kind="not_found_error")  # fmt: skip
        if header_id is not None and not 1 <= len(header_id) <= 256:
            raise RequestError(f"the {TRAJECTORY_HEADER} header must hold 1 to 256 characters, got {len(header_id)}",
                               param="trajectory_id")  # fmt: skip
        if header_id is not None and request.trajectory_id is not None and header_id != request.trajectory_id:
            raise RequestError(f"the {TRAJECTORY_HEADER} header ({header_id!r}) and the body's trajectory_id "
                               f"({request.trajectory_id!r}) name different trajectories: give one, or the same id",
                               param="trajectory_id")  # fmt: skip
        tid = header_id if header_id is not None else request.trajectory_id
        if tid is not None and request.n != 1:
            raise RequestError("trajectory capture records one sample per call: use n=1", param="n")
        return tid

    def _renderer(self, template_kwargs: dict[str, Any] | None) -> ChatRenderer:
        if not template_kwargs:
            return self.renderer
        key = json.dumps(template_kwargs, sort_keys=True)
        renderer = self._renderers.get(key)
        if renderer is None:
            try:
                renderer = ChatRenderer(self.tokenizer, template_kwargs=template_kwargs)
            except Exception as exc:
                raise RequestError(f"the chat template fails with these chat_template_kwargs: {exc}",
                                   param="chat_template_kwargs") from None  # fmt: skip
            self._renderers[key] = renderer
            while len(self._renderers) > _MAX_RENDERERS:
                self._renderers.popitem(last=False)
        self._renderers.move_to_end(key)
        return renderer

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
        constraint = output_constraint(request)
        sampling = self._sampling(request, len(prompt_ids), [renderer.end_of_turn_id], constraint)
        return PreparedCall(request, prompt_ids, sampling, tid, continued, messages=messages, tools=tools,
                            constraint=constraint, template_kwargs=request.chat_template_kwargs)  # fmt: skip

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
        return PreparedCall(request, prompt_ids, sampling, tid, continued, constraint=constraint)

    def _sampling(self, request: SamplingFields, prompt_len: int, stop_ids: list[int],
                  constraint: Constraint) -> SamplingConfig:  # fmt: skip
        room = self.engine.max_model_len - prompt_len
        if room < 1:
            raise RequestError(f"the prompt has {prompt_len} tokens; the model window (max_model_len) is "
                               f"{self.engine.max_model_len}, which leaves no room for a completion",
                               param="messages" if isinstance(request, ChatCompletionRequest) else "prompt")  # fmt: skip
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
            detokenize=request.detokenize or bool(stops),
            stop=stops or None,
            stop_token_ids=[*stop_ids, *(request.stop_token_ids or [])] or None,
            structured_outputs=constraint.params,
        )
        return SamplingConfig(**{k: v for k, v in sampling.items() if v is not None})

    # ---- generating -----------------------------------------------------------------------------------------

    def _choice_sampling(self, call: PreparedCall, i: int) -> SamplingConfig:
        if call.request.n > 1 and call.sampling.seed is not None:
            return call.sampling.model_copy(update={"seed": call.sampling.seed + i})
        return call.sampling

    def _engine_error(self, call: PreparedCall, exc: EngineError) -> Exception:
        if isinstance(exc, EngineRejectedError):
            return RequestError(str(exc), param=call.constraint.param)
        return exc

    async def _generate(self, call: PreparedCall) -> list[Generation]:
        results: list[Generation | None] = [None] * call.request.n

        async def one(i: int) -> None:
            results[i] = await self.engine.generate(call.prompt_ids, self._choice_sampling(call, i))

        try:
            async with anyio.create_task_group() as tg:
                for i in range(call.request.n):
                    tg.start_soon(one, i)
        except* EngineError as group:
            raise self._engine_error(call, group.exceptions[0]) from None
        for r in results:
            if r is not None and r.finish_reason == "error":
                raise self._failed_request(call)
        return [r for r in results if r is not None]

    def _failed_request(self, call: PreparedCall) -> Exception:
        """The error for a request the engine ended with finish_reason `error` (no turn was sampled)."""
        if call.constraint.param is not None:  # e.g. a grammar the engine could not compile
            return RequestError(f"the engine could not sample under the constraint from '{call.constraint.param}' "
                                "(e.g. a recursive schema with no finite value)", param=call.constraint.param)  # fmt: skip
        return EngineError("the engine ended the request with an error")

    async def _deltas(self, call: PreparedCall, i: int) -> AsyncIterator[Generation]:
        sampling = self._choice_sampling(call, i)
        if isinstance(self.engine, StreamingEngine):
            async for delta in self.engine.stream(call.prompt_ids, sampling):
                yield delta
        else:  # an engine that cannot stream: the whole generation is one delta
            yield await self.engine.generate(call.prompt_ids, sampling)

    async def _chunks(self, call: PreparedCall) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed call; its n engine streams run at once, their deltas in arrival order.

        Closing this iterator (a client that went away) cancels the engine streams, which aborts their requests.
        """
        arrivals: asyncio.Queue[tuple[int, Generation | Exception]] = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for delta in self._deltas(call, i):
                    arrivals.put_nowait((i, delta))
            except Exception as exc:  # reported in order, after the deltas before it
                arrivals.put_nowait((i, exc))

        choices = [_Choice(i) for i in range(call.request.n)]
        pumps = [asyncio.create_task(pump(i)) for i in range(call.request.n)]
        failure: Exception | None = None
        sent_any = False
        try:
            while failure is None and any(c.final is None for c in choices):
                i, item = await arrivals.get()
                if isinstance(item, Exception):
                    failure = self._engine_error(call, item) if isinstance(item, EngineError) else item
                    break
                if item.finish_reason == "error":
                    failure = self._failed_request(call)
                    break
                for chunk in self._delta_chunks(call, choices[i], item, first=not sent_any):
                    sent_any = True
                    yield chunk
        finally:
            for task in pumps:
                task.cancel()
        if failure is not None:
            if not sent_any:
                raise failure
            logger.warning("streamed call %s failed: %s", call.id, failure)
            yield {"error": {"message": str(failure), "type": "internal_error", "param": None, "code": 500}}
            return
        if call.request.include_usage:
            yield self._chunk(call, [], usage=self._usage(call, [c.ids for c in choices]))
        if call.trajectory_id is not None:
            c = choices[0]
            assert c.final is not None
            gen = Generation(c.ids, c.logprobs, c.final.finish_reason, c.final.stop_reason)
            text = self._final_text(call, c.ids, gen.finish_reason, gen.stop_reason)
            message = self._message(call, text, gen.finish_reason)[0] if call.chat else None
            self._record(call, gen, message, text)

    def _delta_chunks(
        self, call: PreparedCall, choice: _Choice, delta: Generation, first: bool
    ) -> list[dict[str, Any]]:
        """The chunks for one engine delta of one choice (the last delta also closes the choice)."""
        choice.ids += delta.token_ids
        choice.logprobs += delta.logprobs
        if delta.top_logprobs is not None:
            choice.tops += delta.top_logprobs
        finished = delta.finish_reason != ""
        extra: dict[str, Any] = {"token_ids": delta.token_ids, "sampled_logprobs": finite_logprobs(delta.logprobs)}
        tops = delta.top_logprobs
        if call.chat:
            logprobs = self._chat_logprobs(call, delta.token_ids, delta.logprobs, tops)
        else:
            logprobs = self._completion_logprobs(call, delta.token_ids, delta.logprobs, tops, offset=len(choice.sent))
        pieces: list[dict[str, Any]] = []  # the choice parts of this delta's chunks, in order
        if not finished:
            text = self._visible_text(call, choice.ids)
            new = text[len(choice.sent) :] if text.startswith(choice.sent) else ""
            choice.sent += new
            pieces.append(self._piece(call, choice, content=new))
        else:
            choice.final = delta
            text = self._final_text(call, choice.ids, delta.finish_reason, delta.stop_reason)
            if call.chat:
                message, finish = self._message(call, text, delta.finish_reason)
                content = message["content"] or ""
            else:
                message, finish, content = None, delta.finish_reason, text
            if not content.startswith(choice.sent):  # cannot happen if _visible_text only ever grows
                logger.warning("streamed text of %s diverged from the final text", call.id)
            new = content[len(choice.sent) :] if content.startswith(choice.sent) else ""
            choice.sent += new
            if new or not message or not message.get("tool_calls"):
                pieces.append(self._piece(call, choice, content=new))
            for j, tool_call in enumerate((message or {}).get("tool_calls") or []):
                head = {"index": j, "id": tool_call["id"], "type": "function",
                        "function": {"name": tool_call["function"]["name"], "arguments": ""}}  # fmt: skip
                pieces.append(self._piece(call, choice, tool_calls=[head]))
                arguments = {"index": j, "function": {"arguments": tool_call["function"]["arguments"]}}
                pieces.append(self._piece(call, choice, tool_calls=[arguments]))
            pieces.append({"index": choice.index, **({"delta": {}} if call.chat else {"text": ""}),
                           "finish_reason": finish, "logprobs": None})  # fmt: skip
        pieces[0].update(logprobs=logprobs, **extra)
        chunks = [self._chunk(call, [piece]) for piece in pieces]
        if first:
            chunks[0]["prompt_token_ids"] = call.prompt_ids
        return chunks

    def _piece(self, call: PreparedCall, choice: _Choice, *, content: str = "",
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
        if not call.chat:
            return {"index": choice.index, "text": content, "logprobs": None, "finish_reason": None}
        delta: dict[str, Any] = {}
        if not choice.started:
            delta["role"] = "assistant"
            choice.started = True
        if content:
            delta["content"] = content
        if tool_calls:
            delta["tool_calls"] = tool_calls
        return {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}

    def _chunk(
        self, call: PreparedCall, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": call.id, "object": "chat.completion.chunk" if call.chat else "text_completion",
            "created": call.created, "model": self.model_name, "choices": choices,
        }  # fmt: skip
        if usage is not None:
            chunk["usage"] = usage
        if call.trajectory_id is not None:
            chunk["trajectory_id"] = call.trajectory_id
        return chunk

    # ---- text -----------------------------------------------------------------------------------------------

    def _decode(self, ids: list[int], renderer: ChatRenderer | None = None) -> str:
        return (renderer or self.renderer).decode(ids)

    def _final_text(self, call: PreparedCall, ids: list[int], finish_reason: str, stop_reason: Any) -> str:
        """The text a client sees: without the stop token that ended the call, and cut before a stop string."""
        return read_turn(Generation(ids, [0.0] * len(ids), finish_reason, stop_reason), self.renderer).content

    def _visible_text(self, call: PreparedCall, ids: list[int]) -> str:
        """The part of a running choice's text that no later token can change in the final text."""
        text = self._decode(ids).rstrip("\ufffd")  # an incomplete UTF-8 character
        stops = call.request.stop_strings
        if stops:
            text = text[: max(0, len(text) - (max(len(s) for s in stops) - 1))]
        if call.chat and call.constraint.parse_tools:
            at = text.find(TOOL_CALL_OPEN)
            if at >= 0:
                text = text[:at]
            else:
                for k in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
                    if TOOL_CALL_OPEN.startswith(text[-k:]):
                        text = text[:-k]
                        break
            text = text.rstrip()  # content before tool calls loses its trailing whitespace
        return text

    def _message(self, call: PreparedCall, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
        """The assistant message for `text`, and the finish reason (`tool_calls` when it calls tools)."""
        calls = []
        if call.constraint.parse_tools and finish_reason == "stop" and TOOL_CALL_OPEN in text:
            calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)]
            if not all(_encodable(c.name) for c in calls):
                calls = []
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        tool_calls = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": _dumps(c.arguments)}}
            for c in calls
        ]  # fmt: skip
        content = text[: text.find(TOOL_CALL_OPEN)].rstrip() or None
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, "tool_calls"

    # ---- logprobs and usage ---------------------------------------------------------------------------------

    def _chat_logprobs(self, call: PreparedCall, ids: list[int], logprobs: list[float],
                       tops: list[dict[int, float]] | None) -> dict[str, Any] | None:  # fmt: skip
        request = call.request
        assert isinstance(request, ChatCompletionRequest)
        if not request.logprobs:
            return None
        k = request.top_logprobs or 0
        content = []
        for pos, (token_id, lp) in enumerate(zip(ids, logprobs, strict=True)):
            ranked = sorted((tops[pos] if tops else {}).items(), key=lambda kv: -kv[1])[:k]
            content.append({
                **self.token_texts.entry(token_id), "logprob": _finite_one(lp),
                "top_logprobs": [{**self.token_texts.entry(t), "logprob": _finite_one(v)} for t, v in ranked],
            })  # fmt: skip
        return {"content": content, "refusal": None}

    def _completion_logprobs(self, call: PreparedCall, ids: list[int], logprobs: list[float],
                             tops: list[dict[int, float]] | None, offset: int = 0) -> dict[str, Any] | None:  # fmt: skip
        request = call.request
        assert isinstance(request, CompletionRequest)
        if request.logprobs is None:
            return None
        tokens = [self.token_texts.entry(t)["token"] for t in ids]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        top_list = []
        for pos in range(len(ids)):
            ranked = sorted((tops[pos] if tops else {}).items(), key=lambda kv: -kv[1])[: request.logprobs]
            top = {self.token_texts.entry(t)["token"]: _finite_one(v) for t, v in ranked}
            top.setdefault(tokens[pos], _finite_one(logprobs[pos]))
            top_list.append(top)
        return {"tokens": tokens, "token_logprobs": finite_logprobs(logprobs), "top_logprobs": top_list,
                "text_offset": offsets}  # fmt: skip

    @staticmethod
    def _usage(call: PreparedCall, ids: list[list[int]]) -> dict[str, int]:
        completion = sum(len(x) for x in ids)
        prompt = len(call.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # ---- capture --------------------------------------------------------------------------------------------

    def _record(self, call: PreparedCall, gen: Generation, message: dict[str, Any] | None, text: str) -> None:
        assert call.trajectory_id is not None
        self.recorder.record(call.trajectory_id, CapturedTurn(
            call.prompt_ids, gen.token_ids, gen.logprobs, call.continued, gen.finish_reason, messages=call.messages,
            response_message=message, tools=call.tools, text=text, template_kwargs=call.template_kwargs,
            streamed=call.request.stream,
        ))  # fmt: skip


def _top_n(request: SamplingFields) -> int:
    if isinstance(request, ChatCompletionRequest):
        return (request.top_logprobs or 0) if request.logprobs else 0
    assert isinstance(request, CompletionRequest)
    return request.logprobs or 0


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _dumps(arguments: Any) -> str:
    """Tool-call arguments as a JSON string; a lone surrogate the model wrote stays an escape (`\\udc80`)."""
    text = json.dumps(arguments, ensure_ascii=False)
    return text if _encodable(text) else json.dumps(arguments)


# OpenAI's stand-in for a log-probability of minus infinity (JSON has no infinities).
_NEG_INF_LOGPROB = -9999.0


def _finite_one(value: float) -> float:
    return value if math.isfinite(value) else _NEG_INF_LOGPROB


def finite_logprobs(values: list[float]) -> list[float]:
    """Logprobs fit for JSON: minus infinity (or NaN) becomes OpenAI's -9999.0."""
    return [_finite_one(v) for v in values]
