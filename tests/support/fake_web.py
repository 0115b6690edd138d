"""A loopback fake of Serper, SerpApi, Jina Reader and an OpenAI chat endpoint, for the search and visit tests.

One FastAPI app served by uvicorn on 127.0.0.1 (a free port) in a background thread. Each service speaks its real
request and response shapes and checks its API key like the real one:

| service | route | key check | wrong key |
|---|---|---|---|
| Serper | `POST /serper/search` (JSON object or list) | header `X-API-KEY` | 403 `{"message", "statusCode"}` |
| SerpApi | `GET /serpapi/search.json?engine=google&q=&api_key=&num=` | query `api_key` | 401 `{"error"}` |
| Jina Reader | `GET /jina/{url}` | optional `Authorization: Bearer` | 401 `{"data", "code", "name", ...}` |
| OpenAI | `POST /v1/chat/completions` | `Authorization: Bearer` | 401 `{"error": {...}}` |

Switches (`FakeWeb.plan(service, *faults)`): each request to `service` consumes the next `Fault`; an HTTP status
(429, 500, 401, ...) answers with that service's error body, `body=` answers with that JSON (e.g. SerpApi's
`{"error": ...}` with status 200), `delay_s=` sleeps first (to trigger client timeouts). Requests are recorded
per service (`FakeWeb.requests`, `FakeWeb.count`).

Use the `fake_web` fixture (import `fake_web_fixture` and `fake_web_server_fixture` into the test module): it
yields the running server with its plans, records and pages cleared.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from agentic_rl.server.thread import ServerThread

SERPER_KEY = "test-serper-key"
SERPAPI_KEY = "test-serpapi-key"
JINA_KEY = "test-jina-key"
OPENAI_KEY = "test-openai-key"
SERVICES = ("serper", "serpapi", "jina", "openai")
NO_RESULTS_QUERY = "zzqx no results"


@dataclass(frozen=True)
class Fault:
    """What the next request to a service gets instead of the normal answer.

    Attributes:
        status: the HTTP status; a non-200 one comes with the service's usual error body.
        body: a JSON body to answer with (at `status`), replacing the normal answer.
        delay_s: seconds to wait before answering (the normal answer when status is 200 and body is None).
        headers: extra response headers, e.g. `{"Retry-After": "0"}`.
    """

    status: int = 200
    body: Any = None
    delay_s: float = 0.0
    headers: dict[str, str] | None = None
    gather: int = 0  # hold the answer until this many requests with a gather fault have arrived (at most 60 s)


def slow(delay_s: float) -> Fault:
    return Fault(delay_s=delay_s)


@dataclass
class Recorded:
    """One request as the fake server saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    at: float


def _error_body(service: str, status: int) -> Any:
    messages = {401: "Unauthorized.", 403: "Forbidden.", 429: "Too many requests.", 500: "Internal server error."}
    message = messages.get(status, f"Error {status}.")
    if service == "serper":
        return {"message": message, "statusCode": status}
    if service == "serpapi":
        return {"error": message}
    if service == "jina":
        return {"data": None, "code": status, "name": "FakeError", "status": status * 100, "message": message}
    return {"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error"}}


def _organic(query: str, num: int) -> list[dict[str, Any]]:
    if query == NO_RESULTS_QUERY:
        return []
    slug = re.sub(r"\W+", "-", query.lower()).strip("-")
    return [
        {
            "title": f"{query} - result {i}",
            "link": f"https://example.com/{slug}/{i}",
            "snippet": f"Snippet {i} about {query}.",
            "position": i,
        }
        for i in range(1, num + 1)
    ]


def default_page(url: str) -> str:
    """What Jina Reader answers for a URL without a registered page (its usual text format)."""
    return f"Title: Page at {url}\n\nURL Source: {url}\n\nMarkdown Content:\nThis is the fake content of {url}."


class FakeWeb:
    """The fake services' state; thread-safe (the server runs in its own thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[str, deque[Fault]] = defaultdict(deque)
        self.requests: dict[str, list[Recorded]] = defaultdict(list)
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight: dict[str, int] = defaultdict(int)
        self._gathered: dict[str, int] = defaultdict(int)
        self.pages: dict[str, str] = {}
        self.thread: ServerThread | None = None

    @property
    def base_url(self) -> str:
        assert self.thread is not None, "the fake server is not running"
        return f"http://{self.thread.address}"

    def url(self, service: str) -> str:
        """The `base_url` to give a tool for `service` (`serper`, `serpapi`, `jina`) or the OpenAI `/v1` root."""
        return f"{self.base_url}/v1" if service == "openai" else f"{self.base_url}/{service}"

    def plan(self, service: str, *faults: Fault | int) -> None:
        """Queue what the next requests to `service` get; an int is `Fault(status=int)`."""
        assert service in SERVICES, service
        with self._lock:
            self._plans[service].extend(Fault(status=f) if isinstance(f, int) else f for f in faults)

    def count(self, service: str) -> int:
        """How many requests `service` received since the last reset."""
        with self._lock:
            return len(self.requests[service])

    def reset(self) -> None:
        with self._lock:
            self._plans.clear()
            self.requests.clear()
            self.max_in_flight.clear()
            self._gathered.clear()
            self.pages.clear()

    async def _intake(self, service: str, request: Request) -> tuple[Any, Response | None]:
        """Record the request, apply the next fault; returns (parsed body, early response or None)."""
        raw = await request.body()
        try:
            body = await request.json() if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        record = Recorded(request.method, request.url.path, dict(request.query_params),
                          {k.lower(): v for k, v in request.headers.items()}, body, time.monotonic())  # fmt: skip
        with self._lock:
            self.requests[service].append(record)
            fault = self._plans[service].popleft() if self._plans[service] else None
            self.in_flight[service] += 1
            self.max_in_flight[service] = max(self.max_in_flight[service], self.in_flight[service])
            if fault is not None and fault.gather:
                self._gathered[service] += 1
        try:
            return await self._apply(service, body, fault)
        finally:
            with self._lock:
                self.in_flight[service] -= 1

    async def _apply(self, service: str, body: Any, fault: Fault | None) -> tuple[Any, Response | None]:
        if fault is None:
            return body, None
        deadline = time.monotonic() + 60.0
        while fault.gather and self._gathered[service] < fault.gather and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.status == 200 and fault.body is None:
            return body, None
        content = fault.body if fault.body is not None else _error_body(service, fault.status)
        return body, JSONResponse(content, status_code=fault.status, headers=fault.headers)


def create_fake_app(fake: FakeWeb) -> FastAPI:
    app = FastAPI()

    @app.post("/serper/search")
    async def serper(request: Request) -> Response:
        body, early = await fake._intake("serper", request)
        if early is not None:
            return early
        if request.headers.get("x-api-key") != SERPER_KEY:
            return JSONResponse({"message": "Unauthorized.", "statusCode": 403}, status_code=403)
        items = body if isinstance(body, list) else [body]
        if not items or not all(isinstance(i, dict) and isinstance(i.get("q"), str) and i["q"] for i in items):
            return JSONResponse({"message": "Missing query parameter: q", "statusCode": 400}, status_code=400)
        answers = []
        for item in items:
            num = int(item.get("num", 10))
            answers.append({
                "searchParameters": {"q": item["q"], "type": "search", "num": num, "engine": "google"},
                "organic": _organic(item["q"], num),
                "credits": 1,
            })  # fmt: skip
        return JSONResponse(answers if isinstance(body, list) else answers[0])

    @app.get("/serpapi/search.json")
    async def serpapi(request: Request) -> Response:
        _, early = await fake._intake("serpapi", request)
        if early is not None:
            return early
        params = request.query_params
        if params.get("api_key") != SERPAPI_KEY:
            message = "Invalid API key. Your API key should be here: https://serpapi.com/manage-api-key"
            return JSONResponse({"error": message}, status_code=401)
        if params.get("engine", "google") != "google":
            return JSONResponse({"error": f"Unsupported `{params['engine']}` search engine."}, status_code=400)
        query = params.get("q", "")
        if not query:
            return JSONResponse({"error": "Missing query `q` parameter."}, status_code=400)
        metadata = {"id": "fake", "status": "Success"}
        if query == NO_RESULTS_QUERY:
            return JSONResponse(
                {"search_metadata": metadata, "error": "Google hasn't returned any results for this query."}
            )
        num = int(params.get("num", 10))
        return JSONResponse({
            "search_metadata": metadata,
            "search_parameters": {"engine": "google", "q": query, "num": str(num)},
            "organic_results": _organic(query, num),
        })  # fmt: skip

    @app.get("/jina/{target:path}")
    async def jina(target: str, request: Request) -> Response:
        _, early = await fake._intake("jina", request)
        if early is not None:
            return early
        auth = request.headers.get("authorization")
        if auth is not None and auth != f"Bearer {JINA_KEY}":
            return JSONResponse({"data": None, "code": 401, "name": "AuthenticationFailedError", "status": 40103,
                                 "message": "Invalid API key, please get a new one from https://jina.ai"},
                                status_code=401)  # fmt: skip
        if request.url.query:
            target = f"{target}?{request.url.query}"
        if not target.startswith(("http://", "https://")):
            return JSONResponse({"data": None, "code": 400, "name": "ParamValidationError", "status": 40001,
                                 "message": f"Invalid URL: {target}"}, status_code=400)  # fmt: skip
        return PlainTextResponse(fake.pages.get(target, default_page(target)))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body, early = await fake._intake("openai", request)
        if early is not None:
            return early
        if request.headers.get("authorization") != f"Bearer {OPENAI_KEY}":
            error = {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return JSONResponse({"error": error}, status_code=401)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not body.get("model"):
            return JSONResponse({"error": {"message": "model and messages are required", "type": "invalid_request_error"}},
                                status_code=400)  # fmt: skip
        user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
        goal = next((line[len("Goal: ") :] for line in user.splitlines() if line.startswith("Goal: ")), "")
        content = f"FAKE SUMMARY of {len(user)} characters toward: {goal}"
        return JSONResponse({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": 12, "total_tokens": len(user) // 4 + 12},
        })  # fmt: skip

    return app


@pytest.fixture(scope="module", name="fake_web_server")
def fake_web_server_fixture() -> Iterator[FakeWeb]:
    """The fake services, served on 127.0.0.1 for the whole test module."""
    fake = FakeWeb()
    fake.thread = ServerThread(create_fake_app(fake))
    fake.thread.start()
    yield fake
    fake.thread.stop(timeout_s=5)


@pytest.fixture(name="fake_web")
def fake_web_fixture(fake_web_server: FakeWeb) -> Iterator[FakeWeb]:
    """The running fake services with plans, records and pages cleared before and after the test."""
    fake_web_server.reset()
    yield fake_web_server
    fake_web_server.reset()
