"""`OpenAIServing`: the OpenAI-compatible endpoints' logic, shared by HTTP routes and the in-process `completions`.

A request is first prepared (`prepare`: validated, its prompt ids built, its sampling options and output constraint
set; see `prepare.py`), then answered either whole (`respond`) or as a stream of OpenAI chunks (`stream`; see
`streaming.py`). Both sample through `engine_calls.py` and read the sampled ids with the same `ResponseBuilder`
(`responses.py`), so a streamed call is recorded exactly like a plain one.
"""

from __future__ import annotations

import time
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine
from agentic_rl.server.capture import TrajectoryRecorder
from agentic_rl.server.constraints import MAX_TOOL_CALLS
from agentic_rl.server.engine_calls import generate_choices
from agentic_rl.server.prepare import PreparedCall, RequestPreparer
from agentic_rl.server.responses import ResponseBuilder, finite_logprobs, record_call
from agentic_rl.server.streaming import ChunkStream, stream_chunks
from agentic_rl.server.tokens import TokenTexts

__all__ = ["ChunkStream", "OpenAIServing", "PreparedCall", "finite_logprobs"]


class OpenAIServing:
    """Serves `/v1/completions` and `/v1/chat/completions` from one engine.

    Args:
        engine: the engine to sample from (one with `stream` streams token by token; others send one delta).
        tokenizer: the engine model's tokenizer (chat template, decoding).
        model_name: the name clients pass as `model` (others get 404); also listed by `/v1/models`.
        recorder: where calls tagged with a trajectory id are captured (one is created if None).
        max_tokens_cap: an upper bound on `max_tokens` (besides the model window).
        max_tool_calls: the most tool calls a constrained turn may hold (`tool_choice="required"`, ...).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model_name: str,
        recorder: TrajectoryRecorder | None = None,
        max_tokens_cap: int | None = None,
        max_tool_calls: int = MAX_TOOL_CALLS,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.model_name = model_name
        self.recorder = recorder or TrajectoryRecorder(self.renderer)
        self.created = int(time.time())
        self.token_texts = TokenTexts(tokenizer)
        self.preparer = RequestPreparer(engine, tokenizer, self.renderer, model_name=model_name,
                                        recorder=self.recorder, max_tokens_cap=max_tokens_cap,
                                        max_tool_calls=max_tool_calls)  # fmt: skip
        self.responses = ResponseBuilder(self.renderer, self.token_texts, model_name=model_name)

    @property
    def max_tokens_cap(self) -> int | None:
        """The upper bound on `max_tokens` (besides the model window), or None."""
        return self.preparer.max_tokens_cap

    @max_tokens_cap.setter
    def max_tokens_cap(self, value: int | None) -> None:
        self.preparer.max_tokens_cap = value

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                             "owned_by": "agentic_rl", "max_model_len": self.engine.max_model_len}]}  # fmt: skip

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
        """Validate a request and build its prompt and sampling options (the arguments: `RequestPreparer.prepare`).

        Raises:
            RequestError: for an invalid request (400) or an unknown model (404).
        """
        return self.preparer.prepare(body, trajectory_id=trajectory_id, chat=chat, streaming=streaming)

    async def respond(self, call: PreparedCall) -> dict[str, Any]:
        """Run a prepared call and return the whole response (the call is recorded when tagged).

        Raises:
            RequestError: if the engine rejects the request, or fails it under an output constraint (400).
            EngineError: if the engine fails otherwise.
        """
        generations = await generate_choices(self.engine, call)
        body = self.responses.response(call, generations)
        if call.trajectory_id is not None:
            body["trajectory_id"] = call.trajectory_id
            first = body["choices"][0]
            record_call(self.recorder, call, generations[0], first.get("message"), first.get("text", ""))
        return body

    async def stream(self, call: PreparedCall) -> ChunkStream:
        """Start a prepared call as a stream of OpenAI chunks (ending before `[DONE]`, which HTTP adds).

        The first chunk is computed before this returns, so a request the engine rejects raises here.

        Raises:
            RequestError: if the engine rejects the request (400).
        """
        chunks = stream_chunks(self.engine, call, self.responses, self.recorder)
        try:
            first = await chunks.__anext__()
        except BaseException:
            await chunks.aclose()
            raise
        return ChunkStream(first, chunks)
