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
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentic_rl.errors import RequestError
from agentic_rl.server.protocol import TRAJECTORY_HEADER, error_body
from agentic_rl.server.serving import ChunkStream, OpenAIServing, PreparedCall, finite_logprobs

__all__ = ["DEFAULTS_HEADER", "BodyLimit", "create_app", "error_response"]

logger = logging.getLogger(__name__)

# Response header listing the server defaults a call took for fields its request left out (`max_tokens=128, ...`).
DEFAULTS_HEADER = "X-Server-Defaults"


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
        ended = False
        try:
            await super().stream_response(send)
            ended = True
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            if not ended:  # routine: the client disconnected (or the server is stopping)
                logger.debug("a stream was left before its end; its engine requests are aborted")


def error_response(exc: Exception) -> JSONResponse:
    """Bad input -> 400, unknown model or trajectory -> 404, anything else -> 500; OpenAI's error JSON."""
    if isinstance(exc, RequestError):
        return _JSON(error_body(exc), status_code=exc.status)
    logger.exception("request failed")
    internal = RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, kind="internal_error")
    return _JSON(error_body(internal), status_code=500)


def _too_large(limit: int, size: int | None = None) -> RequestError:
    got = f" ({size} bytes)" if size is not None else ""
    return RequestError(
        f"the request body is larger than this server accepts{got}: at most {limit} bytes",
        status=413,
        kind="request_too_large",
    )


class BodyLimit:
    """ASGI middleware that refuses a request body over `max_bytes` with 413, unread.

    A body whose `Content-Length` is over the limit is answered before any of it is read; a body without one
    (chunked) is counted as it arrives and refused once it passes the limit.

    Args:
        app: the ASGI app to guard.
        max_bytes: the largest body accepted, in bytes.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            exc = _too_large(self.max_bytes, int(declared))
            await _JSON(error_body(exc), status_code=exc.status)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _too_large(self.max_bytes)
            return message

        await self.app(scope, counted, send)


async def _events(chunks: ChunkStream, serving: OpenAIServing, call: PreparedCall) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            serving.note_finish(call, [c.get("finish_reason") for c in chunk.get("choices") or ()])
            yield format_sse_event(data_str=dumps(chunk))
        yield format_sse_event(data_str="[DONE]")
    finally:
        await chunks.aclose()


def _client(request: Request) -> str:
    """`HOST User-Agent` of a request's client (its port changes with every connection)."""
    host = request.client.host if request.client is not None else "unknown"
    return f"{host} {request.headers.get('user-agent', '-')}"


def _call_headers(call: PreparedCall) -> dict[str, str]:
    if not call.defaulted:
        return {}
    text = ", ".join(f"{name}={json.dumps(value, separators=(',', ':'))}" for name, value in call.defaulted.items())
    return {DEFAULTS_HEADER: text.encode("ascii", "backslashreplace").decode("ascii")}


def _add_error_handlers(app: FastAPI) -> None:
    """Errors -> `error_response`; a client that disconnects mid-body -> a debug line, no traceback."""

    @app.exception_handler(Exception)
    async def _any_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, _: ClientDisconnect) -> Response:
        logger.debug("%s disconnected before sending its whole request to %s", _client(request), request.url.path)
        return Response(status_code=400)  # nobody reads it


def create_app(serving: OpenAIServing) -> FastAPI:
    """Build the app: `/v1/completions`, `/v1/chat/completions`, `/v1/models` (and `/v1/models/{id}`), `/health`, `/v1/trajectories/{id}`.

    Send the `X-Trajectory-Id` header (or a `trajectory_id` body field) to have a call captured; fetch the
    assembled trajectory from `GET /v1/trajectories/{id}` (`?pop=true` removes it). `stream=true` answers with
    server-sent events in OpenAI's chunk format, ending with `data: [DONE]`. A body over `serving.max_body_bytes`
    is a 413; a request is validated, rendered and tokenized in a worker thread, off the event loop. A reply that
    took server defaults for fields its request left out lists them (`server_defaults` in the body or the first
    chunk, and the `X-Server-Defaults` header). A client that disconnects is routine: logged at debug level.
    """
    from agentic_rl.records import trajectory_to_dict

    app = FastAPI(title="agentic_rl", docs_url=None, redoc_url=None, default_response_class=_JSON)
    app.state.serving = serving
    if serving.max_body_bytes is not None:
        app.add_middleware(BodyLimit, max_bytes=serving.max_body_bytes)

    _add_error_handlers(app)

    async def answer(request: Request, *, chat: bool) -> Response:
        serving: OpenAIServing = app.state.serving
        call = await serving.aprepare(
            await request.body(), trajectory_id=request.headers.get(TRAJECTORY_HEADER), chat=chat
        )
        call.client = _client(request)
        headers = _call_headers(call)
        if not call.request.stream:
            return _JSON(await serving.respond(call), headers=headers)
        chunks = await serving.stream(call)
        return _EventStream(
            _events(chunks, serving, call), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers}
        )

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
        raise RequestError(f"the model {model_id!r} does not exist", status=404, param="model", kind="not_found_error")

    @app.get("/health")
    async def health() -> JSONResponse:
        return _JSON({"status": "ok"})

    @app.get("/v1/trajectories/{trajectory_id}")
    async def trajectory(trajectory_id: str, pop: bool = False) -> JSONResponse:
        try:
            built = app.state.serving.recorder.build(trajectory_id, pop=pop)
        except KeyError:
            raise RequestError(
                f"no captured trajectory {trajectory_id!r}", status=404, param="trajectory_id", kind="not_found_error"
            ) from None
        record = trajectory_to_dict(built)
        if record["response_logprobs"] is not None:
            record["response_logprobs"] = finite_logprobs(record["response_logprobs"])
        for entry, step in zip(record["steps"], built.steps, strict=True):
            entry.update(
                prompt_ids=step.prompt_ids,
                response_ids=step.response_ids,
                response_logprobs=finite_logprobs(step.response_logprobs),
                chat_completions=step.chat_completions,
            )
        return _JSON(record)

    return app
