"""The logic behind the OpenAI-compatible endpoints, shared by HTTP routes and the in-process `completions`."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import anyio

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine, Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import read_turn
from agentic_rl.errors import EngineError
from agentic_rl.parser import TOOL_CALL_OPEN, ToolCall, parse_tool_calls
from agentic_rl.server.capture import CapturedTurn, TrajectoryRecorder
from agentic_rl.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    SamplingFields,
    parse_request,
)

__all__ = ["OpenAIServing"]

logger = logging.getLogger(__name__)

_PASS_THROUGH = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "seed")


class OpenAIServing:
    """Serves `/v1/completions` and `/v1/chat/completions` from one engine.

    Args:
        engine: the engine to sample from.
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

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                             "owned_by": "agentic_rl", "max_model_len": self.engine.max_model_len}]}  # fmt: skip

    async def handle(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """Dispatch a request dict: `messages` -> chat completion, `prompt` -> completion.

        Raises:
            RequestError: for an invalid request (status 400) or an unknown model (404).
        """
        if isinstance(body, dict) and "messages" in body and "prompt" not in body:
            return await self.chat_completion(body, trajectory_id=trajectory_id)
        if isinstance(body, dict) and "prompt" in body and "messages" not in body:
            return await self.completion(body, trajectory_id=trajectory_id)
        raise RequestError("the request needs exactly one of 'prompt' (completion) or 'messages' (chat)")

    # ---- endpoints ------------------------------------------------------------------------------------------

    async def completion(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """`POST /v1/completions`."""
        request = parse_request(CompletionRequest, body)
        assert isinstance(request, CompletionRequest)
        tid = self._trajectory_id(request, trajectory_id)
        prompt_ids = self.tokenizer.encode(request.prompt, add_special_tokens=True)
        continued = self.recorder.completion_continues(tid, prompt_ids)
        generations = await self._generate(request, prompt_ids, stop_ids=[])
        choices = []
        for i, gen in enumerate(generations):
            text = read_turn(gen, self.renderer).content  # without a stop string or stop token
            choices.append({
                "index": i, "text": text, "finish_reason": gen.finish_reason,
                "logprobs": self._completion_logprobs(gen, request.logprobs),
                "token_ids": gen.token_ids, "sampled_logprobs": gen.logprobs,
            })  # fmt: skip
        if tid is not None:
            gen = generations[0]
            self.recorder.record(tid, CapturedTurn(prompt_ids, gen.token_ids, gen.logprobs, continued,
                                                   gen.finish_reason, text=choices[0]["text"]))  # fmt: skip
        return self._envelope("cmpl", "text_completion", request, prompt_ids, generations, choices, tid)

    async def chat_completion(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """`POST /v1/chat/completions`; tool calls in the output are parsed into OpenAI `tool_calls`."""
        request = parse_request(ChatCompletionRequest, body)
        assert isinstance(request, ChatCompletionRequest)
        tid = self._trajectory_id(request, trajectory_id)
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        tools = request.tools or None
        prompt_ids, continued = self.recorder.chat_prompt(tid, messages, tools)
        generations = await self._generate(request, prompt_ids, stop_ids=[self.renderer.end_of_turn_id])
        top_n = request.top_logprobs if request.top_logprobs is not None else (request.logprobs or 0)
        choices = []
        for i, gen in enumerate(generations):
            text = read_turn(gen, self.renderer).content  # without a stop string or stop token
            message, has_calls = self._assistant_message(text, gen.finish_reason)
            choices.append({
                "index": i, "message": message,
                "finish_reason": "tool_calls" if has_calls else gen.finish_reason,
                "logprobs": self._chat_logprobs(gen, top_n) if request.logprobs else None,
                "token_ids": gen.token_ids, "sampled_logprobs": gen.logprobs,
            })  # fmt: skip
        if tid is not None:
            gen = generations[0]
            self.recorder.record(tid, CapturedTurn(
                prompt_ids, gen.token_ids, gen.logprobs, continued, gen.finish_reason, messages=messages,
                response_message=choices[0]["message"], tools=tools, text=self._decode(gen.token_ids),
            ))  # fmt: skip
        return self._envelope("chatcmpl", "chat.completion", request, prompt_ids, generations, choices, tid)

    # ---- helpers --------------------------------------------------------------------------------------------

    def _trajectory_id(self, request: SamplingFields, header_id: str | None) -> str | None:
        if request.model is not None and request.model != self.model_name:
            raise RequestError(f"model {request.model!r} does not exist; this server serves {self.model_name!r}",
                               status=404, param="model", kind="not_found_error")  # fmt: skip
        tid = header_id or request.trajectory_id
        if tid is not None and request.n != 1:
            raise RequestError("trajectory capture records one sample per call: use n=1", param="n")
        return tid

    def _sampling(self, request: SamplingFields, prompt_len: int, stop_ids: list[int]) -> SamplingConfig:
        room = self.engine.max_model_len - prompt_len
        if room < 1:
            raise RequestError(f"the prompt has {prompt_len} tokens; the model window (max_model_len) is "
                               f"{self.engine.max_model_len}, which leaves no room for a completion",
                               param="messages" if isinstance(request, ChatCompletionRequest) else "prompt")  # fmt: skip
        max_tokens = min(request.max_tokens, room, self.max_tokens_cap or room)
        sampling: dict[str, Any] = {name: getattr(request, name) for name in _PASS_THROUGH}
        sampling.update(
            max_tokens=max_tokens,
            min_tokens=min(request.min_tokens, max_tokens),
            top_k=request.top_k if request.top_k > 0 else -1,
            logprobs=self._top_n(request),
            detokenize=request.detokenize or bool(request.stop),
        )
        if request.stop:
            sampling["stop"] = [request.stop] if isinstance(request.stop, str) else list(request.stop)
        if stop_ids:
            sampling["stop_token_ids"] = stop_ids
        if request.structured_outputs:
            from vllm.sampling_params import StructuredOutputsParams

            try:
                sampling["structured_outputs"] = StructuredOutputsParams(**request.structured_outputs)
            except (TypeError, ValueError) as exc:
                raise RequestError(f"invalid 'structured_outputs': {exc}", param="structured_outputs") from exc
        return SamplingConfig(**{k: v for k, v in sampling.items() if v is not None})

    @staticmethod
    def _top_n(request: SamplingFields) -> int:
        if isinstance(request, ChatCompletionRequest):
            return (request.top_logprobs or 0) if request.logprobs else 0
        return request.logprobs or 0

    async def _generate(self, request: SamplingFields, prompt_ids: list[int], stop_ids: list[int]) -> list[Generation]:
        sampling = self._sampling(request, len(prompt_ids), stop_ids)
        results: list[Generation | None] = [None] * request.n

        async def one(i: int) -> None:
            params = sampling
            if request.n > 1 and sampling.seed is not None:
                params = sampling.model_copy(update={"seed": sampling.seed + i})
            results[i] = await self.engine.generate(prompt_ids, params)

        try:
            async with anyio.create_task_group() as tg:
                for i in range(request.n):
                    tg.start_soon(one, i)
        except* EngineError as group:
            exc = group.exceptions[0]
            if "rejected" in str(exc):
                raise RequestError(str(exc)) from exc
            raise exc from None
        return [r for r in results if r is not None]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @staticmethod
    def _assistant_message(text: str, finish_reason: str) -> tuple[dict[str, Any], bool]:
        calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)] if finish_reason == "stop" else []
        if not calls:
            return {"role": "assistant", "content": text}, False
        import json

        content = text[: text.find(TOOL_CALL_OPEN)].strip() or None
        tool_calls = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in calls
        ]  # fmt: skip
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, True

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(token_id)

    def _completion_logprobs(self, gen: Generation, top_n: int | None) -> dict[str, Any] | None:
        if not top_n:
            return None
        tops = gen.top_logprobs or [{} for _ in gen.token_ids]
        return {
            "tokens": [self._token_text(t) for t in gen.token_ids],
            "token_logprobs": gen.logprobs,
            "top_logprobs": [
                {self._token_text(t): lp for t, lp in sorted(top.items(), key=lambda kv: -kv[1])[:top_n]}
                for top in tops
            ],
        }

    def _chat_logprobs(self, gen: Generation, top_n: int) -> dict[str, Any]:
        tops = gen.top_logprobs or [{} for _ in gen.token_ids]
        content = []
        for token_id, lp, top in zip(gen.token_ids, gen.logprobs, tops, strict=True):
            ranked = sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
            content.append({
                "token": self._token_text(token_id), "logprob": lp,
                "top_logprobs": [{"token": self._token_text(t), "logprob": v} for t, v in ranked],
            })  # fmt: skip
        return {"content": content}

    def _envelope(self, prefix: str, obj: str, request: SamplingFields, prompt_ids: list[int],
                  generations: list[Generation], choices: list[dict[str, Any]], tid: str | None) -> dict[str, Any]:  # fmt: skip
        completion_tokens = sum(len(g.token_ids) for g in generations)
        body = {
            "id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": self.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt_ids) + completion_tokens},
            "prompt_token_ids": prompt_ids,
        }  # fmt: skip
        if tid is not None:
            body["trajectory_id"] = tid
        return body
