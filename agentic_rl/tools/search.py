"""Search tools: Google through Serper or SerpApi, and BM25 over a local JSONL corpus.

The web clients are async (`httpx.AsyncClient`) and send through `agentic_rl.tools.http.request_with_retries`: a
per-attempt timeout, bounded retries with exponential backoff on HTTP 429, 5xx, timeouts and connection errors, no
retry on other 4xx, and an overall deadline so that a clear `ToolError` reaches the model before the environment's
own timeout does.

`LocalSearchTool` searches the shared BM25 index of `agentic_rl.tools.corpus` (built once per corpus file). The
corpus names (`load_corpus`, `get_bm25_index`, `bm25_recall_at_k`, ...) and `cap_text` / `request_with_retries`
are re-exported here for existing importers.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import httpx

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.base import MIN_MAX_CHARS, Tool, cap_text
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
from agentic_rl.tools.http import (
    PerLoop,
    RetryPolicy,
    call_deadline,
    install_httpx_log_redaction,
    request_with_retries,
    require_api_key,
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

SERPER_URL = "https://google.serper.dev"
SERPAPI_URL = "https://serpapi.com"
SERPER_KEY_ENV = "SERPER_KEY_ID"
SERPAPI_KEY_ENV = "SERPAPI_API_KEY"

MAX_QUERY_CHARS = 1000
_SNIPPET_CHARS = 300

# ------------------------------------------------------------------------------- query arguments and results


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
        self.api_key = require_api_key(api_key, self.key_env, type(self).__name__)
        if isinstance(num_results, bool) or not isinstance(num_results, int) or not 1 <= num_results <= 100:
            raise ConfigError(f"num_results must be an integer in [1, 100], got {num_results!r}")
        if not isinstance(max_chars, int) or max_chars < MIN_MAX_CHARS:
            raise ConfigError(f"max_chars must be an integer >= {MIN_MAX_CHARS}, got {max_chars!r}")
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
        self._clients: PerLoop[httpx.AsyncClient] = PerLoop(httpx.AsyncClient, client)

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
        results = await self._search(queries, call_deadline(self.timeout_s))
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
            self._clients.get(),
            "POST",
            f"{self.base_url}/search",
            service=self.service,
            policy=self.policy,
            deadline=deadline,
            auth_hint=self._auth_hint,
            secrets=[self.api_key],
            headers={"X-API-KEY": self.api_key, "Content-Type": "application/json"},
            json=items if len(items) > 1 else items[0],
        )
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
        install_httpx_log_redaction()  # httpx logs request URLs, and SerpApi's key is in the query string

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
            self._clients.get(),
            "GET",
            f"{self.base_url}/search.json",
            service=self.service,
            policy=self.policy,
            deadline=deadline,
            auth_hint=self._auth_hint,
            secrets=[self.api_key],
            params=params,
        )
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


# ---------------------------------------------------------------------------------------------------- local search


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
        if not isinstance(max_chars, int) or max_chars < MIN_MAX_CHARS:
            raise ConfigError(f"max_chars must be an integer >= {MIN_MAX_CHARS}, got {max_chars!r}")
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
