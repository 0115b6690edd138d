"""FastAPI application over `OpenAIServing`: thin routes, and the one place that maps errors to HTTP status."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentic_rl.server.protocol import TRAJECTORY_HEADER, RequestError, error_body
from agentic_rl.server.serving import OpenAIServing

__all__ = ["create_app", "error_response"]

logger = logging.getLogger(__name__)


def error_response(exc: Exception) -> JSONResponse:
    """Bad input -> 400, unknown model or trajectory -> 404, anything else -> 500; OpenAI's error JSON."""
    if isinstance(exc, RequestError):
        return JSONResponse(error_body(exc), status_code=exc.status)
    logger.exception("request failed")
    internal = RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, kind="internal_error")
    return JSONResponse(error_body(internal), status_code=500)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc


def create_app(serving: OpenAIServing) -> FastAPI:
    """Build the app: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`, `/v1/trajectories/{id}`.

    Send the `X-Trajectory-Id` header (or a `trajectory_id` body field) to have a call captured; fetch the
    assembled trajectory from `GET /v1/trajectories/{id}` (`?pop=true` removes it).
    """
    from agentic_rl.types import trajectory_to_dict

    app = FastAPI(title="agentic_rl", docs_url=None, redoc_url=None)
    app.state.serving = serving

    @app.exception_handler(Exception)
    async def _any_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await _json_body(request)
        result = await app.state.serving.completion(body, trajectory_id=request.headers.get(TRAJECTORY_HEADER))
        return JSONResponse(result)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        body = await _json_body(request)
        result = await app.state.serving.chat_completion(body, trajectory_id=request.headers.get(TRAJECTORY_HEADER))
        return JSONResponse(result)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(app.state.serving.models())

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/trajectories/{trajectory_id}")
    async def trajectory(trajectory_id: str, pop: bool = False) -> JSONResponse:
        try:
            built = app.state.serving.recorder.build(trajectory_id, pop=pop)
        except KeyError:
            raise RequestError(f"no captured trajectory {trajectory_id!r}", status=404, param="trajectory_id",
                               kind="not_found_error") from None  # fmt: skip
        return JSONResponse(trajectory_to_dict(built))

    return app
