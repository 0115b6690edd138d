"""FastAPI application over `OpenAIServing`: thin routes, and the one place that maps errors to HTTP status."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.sse import format_sse_event

from agentic_rl.errors import RequestError
from agentic_rl.server.protocol import TRAJECTORY_HEADER, error_body, parse_json
from agentic_rl.server.serving import ChunkStream, OpenAIServing, finite_logprobs

__all__ = ["create_app", "error_response"]

logger = logging.getLogger(__name__)


def dumps(content: Any) -> str:
    """Compact JSON; text the model wrote that is not valid Unicode (a lone surrogate) is kept as an escape."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


class _EventStream(StreamingResponse):
    """Server-sent events that always close their source, so a client that leaves aborts its engine requests."""

    media_type = "text/event-stream"

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]


def error_response(exc: Exception) -> JSONResponse:
    """Bad input -> 400, unknown model or trajectory -> 404, anything else -> 500; OpenAI's error JSON."""
    if isinstance(exc, RequestError):
        return _JSON(error_body(exc), status_code=exc.status)
    logger.exception("request failed")
    internal = RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, kind="internal_error")
    return _JSON(error_body(internal), status_code=500)


async def _events(chunks: ChunkStream) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield format_sse_event(data_str=dumps(chunk))
        yield format_sse_event(data_str="[DONE]")
    finally:
        await chunks.aclose()


def create_app(serving: OpenAIServing) -> FastAPI:
    """Build the app: `/v1/completions`, `/v1/chat/completions`, `/v1/models` (and `/v1/models/{id}`), `/health`, `/v1/trajectories/{id}`.

    Send the `X-Trajectory-Id` header (or a `trajectory_id` body field) to have a call captured; fetch the
    assembled trajectory from `GET /v1/trajectories/{id}` (`?pop=true` removes it). `stream=true` answers with
    server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
    """
    from agentic_rl.types import trajectory_to_dict

    app = FastAPI(title="agentic_rl", docs_url=None, redoc_url=None, default_response_class=_JSON)
    app.state.serving = serving

    @app.exception_handler(Exception)
    async def _any_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    async def answer(request: Request, *, chat: bool) -> Response:
        body = parse_json(await request.body())
        serving: OpenAIServing = app.state.serving
        call = serving.prepare(body, trajectory_id=request.headers.get(TRAJECTORY_HEADER), chat=chat)
        if not call.request.stream:
            return _JSON(await serving.respond(call))
        chunks = await serving.stream(call)
        return _EventStream(_events(chunks), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, chat=True)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return _JSON(app.state.serving.models())

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        for entry in app.state.serving.models()["data"]:
            if entry["id"] == model_id:
                return _JSON(entry)
        raise RequestError(f"the model {model_id!r} does not exist", status=404, param="model",
                           kind="not_found_error")  # fmt: skip

    @app.get("/health")
    async def health() -> JSONResponse:
        return _JSON({"status": "ok"})

    @app.get("/v1/trajectories/{trajectory_id}")
    async def trajectory(trajectory_id: str, pop: bool = False) -> JSONResponse:
        try:
            built = app.state.serving.recorder.build(trajectory_id, pop=pop)
        except KeyError:
            raise RequestError(f"no captured trajectory {trajectory_id!r}", status=404, param="trajectory_id",
                               kind="not_found_error") from None  # fmt: skip
        record = trajectory_to_dict(built)
        if record["response_logprobs"] is not None:
            record["response_logprobs"] = finite_logprobs(record["response_logprobs"])
        for entry, step in zip(record["steps"], built.steps, strict=True):
            entry.update(prompt_ids=step.prompt_ids, response_ids=step.response_ids,
                         response_logprobs=finite_logprobs(step.response_logprobs),
                         chat_completions=step.chat_completions)  # fmt: skip
        return _JSON(record)

    return app
