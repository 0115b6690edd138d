"""`OpenAIServing`: the OpenAI-compatible endpoints' logic, shared by HTTP routes and the in-process `completions`.

A request is first prepared (`prepare`: validated, its prompt ids built, its sampling options and output constraint
set; see `prepare.py`), then answered either whole (`respond`) or as a stream of OpenAI chunks (`stream`; see
`streaming.py`). Both sample through `engine_calls.py` and read the sampled ids with the same `ResponseBuilder`
(`responses.py`), so a streamed call is recorded exactly like a plain one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import anyio

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine
from agentic_rl.server.capture import TrajectoryRecorder
from agentic_rl.server.constraints import MAX_TOOL_CALLS
from agentic_rl.server.engine_calls import generate_choices
from agentic_rl.server.json_body import parse_json
from agentic_rl.server.prepare import PreparedCall, RequestPreparer
from agentic_rl.server.responses import ResponseBuilder, finite_logprobs, record_call
from agentic_rl.server.streaming import ChunkStream, stream_chunks
from agentic_rl.server.tokens import TokenTexts

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ChunkStream", "OpenAIServing", "PreparedCall", "finite_logprobs"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
_MAX_WARNED_CLIENTS = 1024


class OpenAIServing:
    """Serves `/v1/completions` and `/v1/chat/completions` from one engine.

    Args:
        engine: the engine to sample from (one with `stream` streams token by token; others send one delta).
        tokenizer: the engine model's tokenizer (chat template, decoding).
        model_name: the name clients pass as `model` (others get 404); also listed by `/v1/models`.
        recorder: where calls tagged with a trajectory id are captured (one is created if None).
        max_tokens_cap: an upper bound on `max_tokens` (besides the model window).
        max_tool_calls: the most tool calls a constrained turn may hold (`tool_choice="required"`, ...).
        defaults: the server's own defaults for fields requests leave out (e.g. `{"max_tokens": 1024}`; see
            `protocol.DEFAULTABLE_FIELDS`); the others keep the request models' defaults (`max_tokens` 128,
            `temperature` 0.2, `top_k` 50).
        max_body_bytes: the largest request body HTTP accepts, in bytes (a larger one is a 413); None for no limit.

    The tokenizer's own chat template must follow a tool loop token-exactly. Rendered with `chat_template_kwargs`
    (a request's, or the server's default) it may not (Qwen3's with `enable_thinking=False`): it still serves
    every request, and only captured calls are affected (each starts a new token run; the reply says why).

    Raises:
        ConfigError: for an invalid `defaults` entry.
        TemplateError: if the tokenizer has no chat template, or its template cannot be followed token-exactly
            through a tool loop (the message names the reason).
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
        defaults: dict[str, Any] | None = None,
        max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.model_name = model_name
        self.recorder = recorder or TrajectoryRecorder(self.renderer)
        self.created = int(time.time())
        self.token_texts = TokenTexts(tokenizer)
        self.preparer = RequestPreparer(
            engine,
            tokenizer,
            self.renderer,
            model_name=model_name,
            recorder=self.recorder,
            max_tokens_cap=max_tokens_cap,
            max_tool_calls=max_tool_calls,
            defaults=defaults,
        )
        self.responses = ResponseBuilder(self.renderer, self.token_texts, model_name=model_name)
        self.max_body_bytes = max_body_bytes
        self._cut_warned: set[str] = set()

    @property
    def defaults(self) -> dict[str, Any]:
        """The server's own defaults for fields requests leave out (a copy)."""
        return dict(self.preparer.defaults)

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.preparer.defaults = value

    @property
    def max_tokens_cap(self) -> int | None:
        """The upper bound on `max_tokens` (besides the model window), or None."""
        return self.preparer.max_tokens_cap

    @max_tokens_cap.setter
    def max_tokens_cap(self, value: int | None) -> None:
        self.preparer.max_tokens_cap = value

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`."""
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "agentic_rl",
                    "max_model_len": self.engine.max_model_len,
                }
            ],
        }

    async def handle(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """Dispatch a request dict: `messages` -> chat completion, `prompt` -> completion.

        Raises:
            RequestError: for an invalid request (status 400) or an unknown model (404).
        """
        return await self.respond(await self.aprepare(body, trajectory_id=trajectory_id, streaming=False))

    async def completion(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """`POST /v1/completions` (not streamed)."""
        return await self.respond(await self.aprepare(body, trajectory_id=trajectory_id, chat=False, streaming=False))

    async def chat_completion(self, body: Any, *, trajectory_id: str | None = None) -> dict[str, Any]:
        """`POST /v1/chat/completions` (not streamed)."""
        return await self.respond(await self.aprepare(body, trajectory_id=trajectory_id, chat=True, streaming=False))

    def prepare(
        self, body: Any, *, trajectory_id: str | None = None, chat: bool | None = None, streaming: bool | None = None
    ) -> PreparedCall:
        """Validate a request and build its prompt and sampling options (the arguments: `RequestPreparer.prepare`).

        Raises:
            RequestError: for an invalid request (400) or an unknown model (404).
        """
        return self.preparer.prepare(body, trajectory_id=trajectory_id, chat=chat, streaming=streaming)

    async def aprepare(
        self, body: Any, *, trajectory_id: str | None = None, chat: bool | None = None, streaming: bool | None = None
    ) -> PreparedCall:
        """`prepare` in a worker thread: validating, rendering and tokenizing a large request leave the event loop
        free for other requests. `body` may be the raw bytes of an HTTP body (decoded by `json_body.parse_json`).

        Raises:
            RequestError: for a body that is not acceptable JSON or an invalid request (400), an unknown model (404).
        """

        def prepare() -> PreparedCall:
            decoded = parse_json(body) if isinstance(body, bytes) else body
            return self.preparer.prepare(decoded, trajectory_id=trajectory_id, chat=chat, streaming=streaming)

        return await anyio.to_thread.run_sync(prepare)

    def note_finish(self, call: PreparedCall, finish_reasons: Iterable[str | None]) -> None:
        """Warn (once per client) when a reply was cut at a `max_tokens` the request left to the server's default."""
        if "max_tokens" not in call.defaulted or "length" not in finish_reasons or call.client in self._cut_warned:
            return
        if len(self._cut_warned) >= _MAX_WARNED_CLIENTS:
            self._cut_warned.clear()
        self._cut_warned.add(call.client)
        logger.warning(
            "a reply to %s was cut at max_tokens=%d, the server's default, as the request does not set "
            "max_tokens: set it in the request, or start the server with --default max_tokens=N "
            "(warned once per client)",
            call.client,
            call.defaulted["max_tokens"],
        )

    @staticmethod
    def annotate(call: PreparedCall, body: dict[str, Any]) -> None:
        """Add what the server decided for the caller to a response body (or a stream's first chunk):
        `server_defaults` (the defaults the call took for left-out fields) and, for a captured call whose template
        cannot be followed token-exactly, `capture_warning`."""
        if call.defaulted:
            body["server_defaults"] = dict(call.defaulted)
        if call.capture_problem is not None:
            body["capture_warning"] = call.capture_problem

    async def respond(self, call: PreparedCall) -> dict[str, Any]:
        """Run a prepared call and return the whole response (the call is recorded when tagged).

        Raises:
            RequestError: if the engine rejects the request, or fails it under an output constraint (400).
            EngineError: if the engine fails otherwise.
        """
        generations = await generate_choices(self.engine, call)
        body = self.responses.response(call, generations)
        self.annotate(call, body)
        self.note_finish(call, [g.finish_reason for g in generations])
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
        self.annotate(call, first)
        return ChunkStream(first, chunks)
