"""Search tools: Google through Serper or SerpApi, and BM25 over a local JSONL corpus.

The web clients are async (`httpx.AsyncClient`) and share `request_with_retries`: a per-attempt timeout, bounded
retries with exponential backoff on HTTP 429, 5xx, timeouts and connection errors, no retry on other 4xx, and an
overall deadline so that a clear `ToolError` reaches the model before the environment's own timeout does.

`LocalSearchTool` searches the shared BM25 index of `agentic_rl.tools.corpus` (built once per corpus file). The
corpus names (`load_corpus`, `get_bm25_index`, `bm25_recall_at_k`, ...) are re-exported here for existing importers.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
import httpx

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.base import Tool
from agentic_rl.tools.corpus import (
    DEFAULT_CORPUS_PATH,
    DEFAULT_QUESTIONS_PATH,
    BM25Index,
    Corpus,
    Document,
    bm25_recall_at_k,
    clear_corpus_caches,
    get_bm25_index,
    load_corpus,
)

__all__ = [
    "DEFAULT_CORPUS_PATH",
    "DEFAULT_QUESTIONS_PATH",
    "BM25Index",
    "Corpus",
    "Document",
    "LocalSearchTool",
    "SerpApiSearchTool",
    "SerperSearchTool",
    "bm25_recall_at_k",
    "cap_text",
    "clear_corpus_caches",
    "get_bm25_index",
    "load_corpus",
    "request_with_retries",
]

logger = logging.getLogger(__name__)

SERPER_URL = "https://google.serper.dev"
SERPAPI_URL = "https://serpapi.com"
SERPER_KEY_ENV = "SERPER_KEY_ID"
SERPAPI_KEY_ENV = "SERPAPI_API_KEY"

MAX_QUERY_CHARS = 1000
_MIN_MAX_CHARS = 200
_SNIPPET_CHARS = 300

T = TypeVar("T")

# ----------------------------------------------------------------------------------------------- shared helpers


def cap_text(text: str, max_chars: int) -> str:
    """Cut `text` to at most `max_chars` characters, ending with a `...[truncated N characters]` marker.

    Args:
        text: the text to cap.
        max_chars: the most characters of the result, marker included (must exceed the marker's ~40 characters).

    Returns:
        `text` itself when it fits, else its start plus the marker; never longer than `max_chars`.
    """
    if len(text) <= max_chars:
        return text
    # The marker counts at most len(text) characters, so its length with len(text) is an upper bound.
    keep = max(0, max_chars - len(f"\n...[truncated {len(text)} characters]"))
    return text[:keep] + f"\n...[truncated {len(text) - keep} characters]"


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _error_detail(response: httpx.Response, secrets: Iterable[str] = ()) -> str:
    """The human-readable error of a failed response: the `error` / `message` / `detail` field, else the body."""
    detail = ""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("error", "message", "detail"):
            value = body.get(key)
            if isinstance(value, dict):  # OpenAI style: {"error": {"message": ...}}
                value = value.get("message")
            if isinstance(value, str) and value.strip():
                detail = value
                break
    if not detail:
        detail = response.text
    detail = " ".join(detail.split())
    return _redact(detail[:300], secrets)


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: not worth parsing, fall back to our own backoff
        return None


@dataclass(frozen=True)
class RetryPolicy:
    """How `request_with_retries` retries.

    Attributes:
        max_retries: retries after the first attempt (0 = one attempt only).
        backoff_s: delay before the first retry in seconds; doubles on each further retry (with 50-100% jitter).
        max_backoff_s: the longest delay between two attempts in seconds (also caps a server's `Retry-After`).
        request_timeout_s: the limit of one attempt (connect + send + receive) in seconds.
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    request_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        if not self.backoff_s >= 0 or not self.max_backoff_s >= 0:
            raise ConfigError(f"backoff_s and max_backoff_s must be >= 0, got {self.backoff_s}, {self.max_backoff_s}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {self.request_timeout_s!r}")

    def delay_s(self, retry: int) -> float:
        """The delay before retry number `retry` (1-based), in seconds."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1)) * random.uniform(0.5, 1.0)


_RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


async def request_with_retries(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    service: str,
    policy: RetryPolicy = RetryPolicy(),  # noqa: B008  (frozen dataclass, safe as a default)
    deadline: float | None = None,
    auth_hint: str = "",
    secrets: Sequence[str] = (),
    **kwargs: Any,
) -> httpx.Response:
    """Send one HTTP request with timeouts and bounded retries; return the first successful (2xx) response.

    Retried: HTTP 429 and 5xx (honouring `Retry-After`, capped at `policy.max_backoff_s`), timeouts, connection
    and network errors. Not retried: any other status (401/403 are reported as authentication failures).

    Args:
        client: the HTTP client to send with.
        method: the HTTP method, e.g. `"GET"`.
        url: the full URL. It is never put into error messages (it may carry an API key).
        service: the service name used in error messages, e.g. `"Serper"`.
        policy: retry count, backoff and per-attempt timeout.
        deadline: a `time.monotonic()` instant after which no attempt starts or continues; attempts are cut short
            to end by it. None: no overall limit besides the retries.
        auth_hint: appended to authentication errors, e.g. which environment variable holds the key.
        secrets: strings (API keys) blanked out of any error text.
        **kwargs: passed to `client.request` (`json`, `params`, `headers`, ...).

    Returns:
        The successful response.

    Raises:
        ToolError: on a non-retryable status, after the last failed attempt, or when the deadline is reached; the
            message names the service, the status or error, and the number of attempts.
    """
    attempts = policy.max_retries + 1
    last_error = "no attempt made"
    for attempt in range(1, attempts + 1):
        per_try = policy.request_timeout_s
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ToolError(f"{service}: out of time after {attempt - 1} attempt(s); last error: {last_error}")
            per_try = min(per_try, remaining)
        retry_after = None
        try:
            response = await client.request(method, url, timeout=per_try, **kwargs)
        except httpx.ConnectTimeout:
            last_error = f"could not connect (timed out after {per_try:.3g} s)"
        except httpx.TimeoutException:
            last_error = f"timed out after {per_try:.3g} s"
        except _RETRYABLE_TRANSPORT as exc:
            kind = "could not connect" if isinstance(exc, httpx.ConnectError) else "network error"
            last_error = _redact(f"{kind}: {type(exc).__name__}: {exc}", secrets)
        except httpx.HTTPError as exc:  # invalid URL, unsupported protocol, ...: retrying cannot help
            raise ToolError(_redact(f"{service}: request failed: {type(exc).__name__}: {exc}", secrets)) from exc
        else:
            status = response.status_code
            if response.is_success:
                return response
            detail = _error_detail(response, secrets)
            reason = f"HTTP {status} {response.reason_phrase}".rstrip() + (f": {detail}" if detail else "")
            if status in (401, 403):
                hint = f" {auth_hint}" if auth_hint else ""
                raise ToolError(f"{service}: authentication failed ({reason}).{hint}")
            if status != 429 and status < 500:
                raise ToolError(f"{service}: request rejected ({reason})")
            last_error = reason
            retry_after = _retry_after_s(response)
        if attempt == attempts:
            break
        delay = policy.delay_s(attempt)
        if retry_after is not None:
            delay = max(delay, min(retry_after, policy.max_backoff_s))
        if deadline is not None and time.monotonic() + delay >= deadline:
            raise ToolError(f"{service}: out of time after {attempt} attempt(s); last error: {last_error}")
        logger.info("%s: %s; retry %d/%d in %.2f s", service, last_error, attempt, policy.max_retries, delay)
        await anyio.sleep(delay)
    raise ToolError(f"{service}: {last_error} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})")


class _PerLoop(Generic[T]):
    """One object (an HTTP client) per running event loop: async clients are bound to the loop that created them.

    When the loop changes (a new `anyio.run`, a new test), the next `get()` builds a fresh object; the old one is
    dropped with its loop.
    """

    def __init__(self, factory: Callable[[], T], fixed: T | None = None) -> None:
        self._factory = factory
        self._fixed = fixed
        self._token: Any = None
        self._obj: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        if self._fixed is not None:
            return self._fixed
        token = anyio.lowlevel.current_token()
        with self._lock:
            if self._obj is None or self._token != token:
                self._obj, self._token = self._factory(), token
            return self._obj

    async def aclose(self) -> None:
        """Close the object of the current loop, if any (a caller-provided object is left open)."""
        with self._lock:
            obj, same_loop = self._obj, self._token == anyio.lowlevel.current_token()
            self._obj = self._token = None
        if obj is not None and same_loop:
            close = getattr(obj, "aclose", None) or getattr(obj, "close", None)
            if close is not None:
                result = close()
                if hasattr(result, "__await__"):
                    await result


def _deadline(timeout_s: float) -> float:
    """A monotonic deadline slightly inside `timeout_s`, so our own error wins over the environment's timeout."""
    return time.monotonic() + timeout_s - min(0.5, 0.05 * timeout_s)


def _parse_queries(arguments: dict[str, Any], max_queries: int, tool: str = "search") -> list[str]:
    """The queries of `{"query": str | list[str]}`.

    Raises:
        ToolError: for a missing, empty, non-string or too long query, or more than `max_queries` queries.
    """
    usage = f'{tool} needs {{"query": "<text>"}} or {{"query": ["<text>", ...]}}'
    query = arguments.get("query") if isinstance(arguments, dict) else None
    if isinstance(query, str) and query.strip().startswith("["):  # a list sent as a JSON string
        try:
            decoded = json.loads(query)
        except ValueError:
            decoded = None
        if isinstance(decoded, list) and decoded and all(isinstance(q, str) for q in decoded):
            query = decoded
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
        raise ToolError(usage)
    queries = [" ".join(q.split()) for q in queries]
    if not all(queries):
        raise ToolError(f"{usage}; empty queries are not allowed")
    if len(queries) > max_queries:
        raise ToolError(f"at most {max_queries} queries per call, got {len(queries)}")
    for q in queries:
        if len(q) > MAX_QUERY_CHARS:
            raise ToolError(f"query too long ({len(q)} characters, at most {MAX_QUERY_CHARS})")
    return queries


def _format_web_results(query: str, results: list[dict[str, Any]] | str) -> str:
    """One query's section: a header, then `N. title / link / snippet` items (or an error / no-results line)."""
    lines = [f'Results for "{query}":']
    if isinstance(results, str):
        lines.append(f"Error: {results}")
    elif not results:
        lines.append("No results found.")
    for i, item in enumerate(results if isinstance(results, list) else [], 1):
        title = " ".join(str(item.get("title") or "(no title)").split())
        lines.append(f"{i}. {title}")
        if item.get("link"):
            lines.append(f"   {item['link']}")
        if item.get("snippet"):
            lines.append(f"   {' '.join(str(item['snippet']).split())}")
    return "\n".join(lines)


def _api_key(explicit: str | None, env_var: str, owner: str) -> str:
    key = explicit if explicit is not None else os.environ.get(env_var, "")
    if not key or not key.strip():
        raise ConfigError(f"{owner} needs an API key: set the {env_var} environment variable or pass api_key=")
    return key.strip()


class _RedactQueryKeyFilter(logging.Filter):
    """Blanks `api_key=...` in httpx's request log lines (SerpApi takes its key as a query parameter)."""

    _pattern = re.compile(r"(api_key=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and any("api_key=" in str(a) for a in record.args):
            record.msg = self._pattern.sub(r"\1***", record.getMessage())
            record.args = ()
        return True


def _install_httpx_log_redaction() -> None:
    httpx_logger = logging.getLogger("httpx")
    if not any(isinstance(f, _RedactQueryKeyFilter) for f in httpx_logger.filters):
        httpx_logger.addFilter(_RedactQueryKeyFilter())


# ---------------------------------------------------------------------------------------------- web search tools


def _query_schema(description: str) -> dict[str, Any]:
    """JSON schema of a `query` argument: one string, or a list of up to 5 (searched in one call)."""
    return {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5}],
        "description": description,
    }


class _WebSearchTool(Tool):
    """Shared parts of the Serper and SerpApi clients (see `SerperSearchTool` for the arguments)."""

    name = "search"
    description = (
        "Search the web with Google. Returns numbered results with title, link and snippet. "
        "Pass a list of queries to run several searches at once."
    )
    parameters = {
        "type": "object",
        "properties": {"query": _query_schema("A search query, or a list of queries to search in one call.")},
        "required": ["query"],
    }
    service = ""
    key_env = ""
    default_url = ""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        num_results: int = 10,
        max_chars: int = 6000,
        max_queries: int = 5,
        timeout_s: float = 30.0,
        request_timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.api_key = _api_key(api_key, self.key_env, type(self).__name__)
        if isinstance(num_results, bool) or not isinstance(num_results, int) or not 1 <= num_results <= 100:
            raise ConfigError(f"num_results must be an integer in [1, 100], got {num_results!r}")
        if not isinstance(max_chars, int) or max_chars < _MIN_MAX_CHARS:
            raise ConfigError(f"max_chars must be an integer >= {_MIN_MAX_CHARS}, got {max_chars!r}")
        if not isinstance(max_queries, int) or max_queries < 1:
            raise ConfigError(f"max_queries must be an integer >= 1, got {max_queries!r}")
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.base_url = (base_url or self.default_url).rstrip("/")
        self.num_results = num_results
        self.max_chars = max_chars
        self.max_queries = max_queries
        self.timeout_s = float(timeout_s)
        self.policy = RetryPolicy(max_retries, backoff_s, max_backoff_s, request_timeout_s)
        self._clients: _PerLoop[httpx.AsyncClient] = _PerLoop(httpx.AsyncClient, client)

    @property
    def _auth_hint(self) -> str:
        return f"Check the API key ({self.key_env})."

    async def aclose(self) -> None:
        """Close the HTTP client of the current event loop (a client passed to the constructor stays open)."""
        await self._clients.aclose()

    async def execute(self, arguments: dict[str, Any]) -> str:  # type: ignore[override]
        """Search for `{"query": str | list[str]}`.

        Returns:
            One section per query (`Results for "q":` then `N. title / link / snippet`), capped at `max_chars`.

        Raises:
            ToolError: for invalid arguments, or when the service fails (after retries) for every query.
        """
        queries = _parse_queries(arguments, self.max_queries)
        results = await self._search(queries, _deadline(self.timeout_s))
        errors = [r for r in results if isinstance(r, str)]
        if len(errors) == len(results):
            raise ToolError(errors[0] if len(errors) == 1 else "; ".join(dict.fromkeys(errors)))
        text = "\n\n".join(_format_web_results(q, r) for q, r in zip(queries, results, strict=True))
        return cap_text(text, self.max_chars)

    async def _search(self, queries: list[str], deadline: float) -> list[list[dict[str, Any]] | str]:
        """Per query: the organic results, or an error message."""
        raise NotImplementedError


class SerperSearchTool(_WebSearchTool):
    """Google search through Serper (`POST {base_url}/search`, header `X-API-KEY`).

    Several queries go out as one batched request (a JSON list of `{"q", "num"}` objects).

    Args:
        api_key: the Serper key; default: the `SERPER_KEY_ID` environment variable.
        base_url: the service root, without `/search` (tests point it at a fake server).
        num_results: results asked per query (Serper's `num`), 1..100.
        max_chars: the most characters of one observation, truncation marker included (>= 200).
        max_queries: the most queries in one call.
        timeout_s: wall-clock budget of one call in seconds, retries included (also the environment's limit).
        request_timeout_s: limit of one HTTP attempt in seconds.
        max_retries: retries after the first attempt on 429, 5xx, timeouts and connection errors.
        backoff_s: delay before the first retry in seconds, doubled on each further one (with jitter).
        max_backoff_s: the longest delay between attempts in seconds.
        client: an `httpx.AsyncClient` to use (left open by `aclose`); default: one per event loop.

    Raises:
        ConfigError: at construction, if no API key is given or set, or a parameter is out of range.
    """

    service = "Serper"
    key_env = SERPER_KEY_ENV
    default_url = SERPER_URL

    async def _search(self, queries: list[str], deadline: float) -> list[list[dict[str, Any]] | str]:
        items = [{"q": q, "num": self.num_results} for q in queries]
        response = await request_with_retries(
            self._clients.get(), "POST", f"{self.base_url}/search", service=self.service, policy=self.policy,
            deadline=deadline, auth_hint=self._auth_hint, secrets=[self.api_key],
            headers={"X-API-KEY": self.api_key, "Content-Type": "application/json"},
            json=items if len(items) > 1 else items[0],
        )  # fmt: skip
        try:
            body = response.json()
        except ValueError as exc:
            raise ToolError(f"{self.service}: the response is not JSON") from exc
        bodies = body if isinstance(body, list) else [body]
        if len(bodies) != len(queries) or not all(isinstance(b, dict) for b in bodies):
            raise ToolError(f"{self.service}: unexpected response shape for {len(queries)} queries")
        return [_organic(b, "organic", self.service) for b in bodies]


class SerpApiSearchTool(_WebSearchTool):
    """Google search through SerpApi (`GET {base_url}/search.json?engine=google&q=...&api_key=...&num=k`).

    SerpApi has no batch endpoint: several queries are sent concurrently. A query that fails shows as an error line
    in its section; the call fails only when every query fails. Takes the same arguments as `SerperSearchTool`,
    except that the key comes from `SERPAPI_API_KEY`.

    Raises:
        ConfigError: at construction, if no API key is given or set, or a parameter is out of range.
    """

    service = "SerpApi"
    key_env = SERPAPI_KEY_ENV
    default_url = SERPAPI_URL

    def __init__(self, api_key: str | None = None, **options: Any) -> None:
        super().__init__(api_key, **options)
        _install_httpx_log_redaction()  # httpx logs request URLs, and SerpApi's key is in the query string

    async def _search(self, queries: list[str], deadline: float) -> list[list[dict[str, Any]] | str]:
        results: list[list[dict[str, Any]] | str] = [""] * len(queries)

        async def one(i: int, query: str) -> None:
            try:
                results[i] = await self._search_one(query, deadline)
            except ToolError as exc:
                results[i] = str(exc)

        async with anyio.create_task_group() as tg:
            for i, query in enumerate(queries):
                tg.start_soon(one, i, query)
        return results

    async def _search_one(self, query: str, deadline: float) -> list[dict[str, Any]]:
        params = {"engine": "google", "q": query, "api_key": self.api_key, "num": self.num_results}
        response = await request_with_retries(
            self._clients.get(), "GET", f"{self.base_url}/search.json", service=self.service, policy=self.policy,
            deadline=deadline, auth_hint=self._auth_hint, secrets=[self.api_key], params=params,
        )  # fmt: skip
        try:
            body = response.json()
        except ValueError as exc:
            raise ToolError(f"{self.service}: the response is not JSON") from exc
        if not isinstance(body, dict):
            raise ToolError(f"{self.service}: unexpected response shape")
        return _organic(body, "organic_results", self.service)


def _organic(body: dict[str, Any], key: str, service: str) -> list[dict[str, Any]]:
    """The organic results of one search response.

    Raises:
        ToolError: if the body carries an `error` (other than SerpApi's "no results") or no result list.
    """
    error = body.get("error")
    if isinstance(error, str) and error:
        if "hasn't returned any results" in error or "no results" in error.lower():
            return []
        raise ToolError(f"{service}: {' '.join(error.split())[:300]}")
    organic = body.get(key, [])
    if not isinstance(organic, list):
        raise ToolError(f"{service}: unexpected response shape ({key!r} is not a list)")
    return [item for item in organic if isinstance(item, dict)]


def _snippet(text: str, max_chars: int = _SNIPPET_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars)
    return text[: cut if cut > max_chars // 2 else max_chars] + "..."


class LocalSearchTool(Tool):
    """BM25 keyword search over a local `{id, title, text}` JSONL corpus (by default the HotpotQA corpus).

    `execute` is synchronous (the environment runs it in a worker thread). The index is shared through
    `get_bm25_index`, so many instances and concurrent trajectories cost one index.

    Args:
        corpus_path: the JSONL corpus.
        top_k: hits per query when the call gives no `top_k`.
        max_top_k: the largest `top_k` a call may ask for.
        max_chars: the most characters of one observation, truncation marker included (>= 200).
        max_queries: the most queries in one call.
        stemmer: a PyStemmer language for stemming, or None.

    Attributes:
        index: the shared `BM25Index`.

    Raises:
        ConfigError: at construction, for a missing or malformed corpus, bad parameters, or missing PyStemmer.
    """

    name = "search"
    description = (
        "Search a local Wikipedia corpus by keywords (BM25). Returns numbered hits as [doc id] title plus the "
        "start of the text; open a whole document with the visit tool and its id. Pass a list of queries to run "
        "several searches at once."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query": _query_schema("Keywords to search for, or a list of such queries."),
            "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Hits per query (default 5)."},
        },
        "required": ["query"],
    }
    timeout_s = 10.0

    def __init__(
        self,
        corpus_path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH,
        *,
        top_k: int = 5,
        max_top_k: int = 20,
        max_chars: int = 6000,
        max_queries: int = 5,
        stemmer: str | None = "english",
    ) -> None:
        if isinstance(max_top_k, bool) or not isinstance(max_top_k, int) or max_top_k < 1:
            raise ConfigError(f"max_top_k must be an integer >= 1, got {max_top_k!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= max_top_k:
            raise ConfigError(f"top_k must be an integer in [1, {max_top_k}], got {top_k!r}")
        if not isinstance(max_chars, int) or max_chars < _MIN_MAX_CHARS:
            raise ConfigError(f"max_chars must be an integer >= {_MIN_MAX_CHARS}, got {max_chars!r}")
        if not isinstance(max_queries, int) or max_queries < 1:
            raise ConfigError(f"max_queries must be an integer >= 1, got {max_queries!r}")
        self.top_k = top_k
        self.max_top_k = max_top_k
        self.max_chars = max_chars
        self.max_queries = max_queries
        self.index = get_bm25_index(corpus_path, stemmer)

    def search_ids(self, query: str, k: int = 5) -> list[str]:
        """The ids of the best `k` documents for `query`, best first (for evaluation; thread-safe)."""
        return [doc.id for doc, _ in self.index.search(query, k)]

    def execute(self, arguments: dict[str, Any]) -> str:
        """Search for `{"query": str | list[str], "top_k"?: int}`.

        Returns:
            Per query a `Results for "q":` header and numbered `[doc id] title` lines, each followed by the first
            ~300 characters of the document; capped at `max_chars`.

        Raises:
            ToolError: for invalid arguments (empty query, too many queries, `top_k` out of range).
        """
        queries = _parse_queries(arguments, self.max_queries)
        top_k = arguments.get("top_k", self.top_k)
        if top_k is None:
            top_k = self.top_k
        if isinstance(top_k, float) and top_k.is_integer():
            top_k = int(top_k)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= self.max_top_k:
            raise ToolError(f"top_k must be an integer from 1 to {self.max_top_k}, got {top_k!r}")
        sections = []
        for query in queries:
            lines = [f'Results for "{query}":']
            hits = self.index.search(query, top_k)
            if not hits:
                lines.append("No results found.")
            for i, (doc, _) in enumerate(hits, 1):
                lines.append(f"{i}. [{doc.id}] {doc.title}")
                lines.append(f"   {_snippet(doc.text)}")
            sections.append("\n".join(lines))
        return cap_text("\n\n".join(sections), self.max_chars)
