"""Visit tools: read a web page through Jina Reader (optionally summarized toward a goal), or a local document.

`VisitTool` fetches `GET {base_url}/{url}` from Jina Reader with the same timeout and retry behaviour as the search
tools (`agentic_rl.tools.http.request_with_retries`). Pages longer than `max_page_chars` are summarized toward the
call's `goal` by an OpenAI-compatible chat endpoint when one is configured (our own server in production); if that
fails, the model gets the truncated page with a note instead.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import anyio
import httpx

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.base import MIN_MAX_CHARS, Tool, cap_text
from agentic_rl.tools.corpus import DEFAULT_CORPUS_PATH, load_corpus
from agentic_rl.tools.http import PerLoop, RetryPolicy, call_deadline, request_with_retries

__all__ = ["JINA_READER_URL", "LocalVisitTool", "VisitTool"]

logger = logging.getLogger(__name__)

JINA_READER_URL = "https://r.jina.ai"
JINA_KEY_ENV = "JINA_API_KEY"
MAX_URL_CHARS = 2048
DEFAULT_GOAL = "Summarize the main content of the page."

SUMMARY_SYSTEM_PROMPT = (
    "You extract information from web pages for a research agent. Given a goal and the content of a page, write "
    "a concise summary of what the page says that is relevant to the goal: keep names, numbers, dates and short "
    "quotes exactly as written. If the page has nothing relevant to the goal, say so in one sentence."
)


class VisitTool(Tool):
    """Reads a web page through Jina Reader (`GET {base_url}/{url}`), as text/markdown.

    Args:
        api_key: the Jina key, sent as `Authorization: Bearer`; default: the `JINA_API_KEY` environment variable,
            and none at all when that is unset (Jina Reader works without a key, at a lower rate limit).
        base_url: the reader's root (tests point it at a fake server).
        max_page_chars: the most characters of the returned page or summary, truncation marker included (>= 200).
        summary_base_url: an OpenAI-compatible endpoint, e.g. `http://127.0.0.1:8000/v1`, to summarize pages
            longer than `max_page_chars`; None: long pages are truncated.
        summary_model: the model name sent to that endpoint; required with `summary_base_url`.
        summary_api_key: the key for that endpoint; default: `OPENAI_API_KEY`, else `"local"`.
        summary_timeout_s: limit of the summary request in seconds (further bounded by `timeout_s`).
        summary_max_tokens: the most tokens of a summary.
        max_summary_input_chars: the most page characters sent to the summarizer.
        timeout_s: wall-clock budget of one call in seconds, fetch retries and summary included (also the
            environment's limit).
        request_timeout_s: limit of one fetch attempt in seconds.
        max_retries: fetch retries after the first attempt on 429, 5xx, timeouts and connection errors.
        backoff_s: delay before the first retry in seconds, doubled on each further one (with jitter).
        max_backoff_s: the longest delay between attempts in seconds.
        client: an `httpx.AsyncClient` for the fetches; default: one per event loop.
        summary_client: an `openai.AsyncOpenAI` for the summaries; default: one per event loop built from
            `summary_base_url`.

    Raises:
        ConfigError: at construction, if only one of `summary_base_url` / `summary_model` is given, or a parameter
            is out of range.
    """

    name = "visit"
    description = (
        "Open a web page by URL and return its content as text. Give a goal (what you are looking for) to get a "
        "summary of the relevant parts of long pages."
    )
    parameters = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "The page URL, starting with http:// or https://"},
            "goal": {"type": "string", "description": "What information you want from the page."},
        },
        "required": ["url"],
    }

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str = JINA_READER_URL,
        max_page_chars: int = 6000,
        summary_base_url: str | None = None,
        summary_model: str | None = None,
        summary_api_key: str | None = None,
        summary_timeout_s: float = 60.0,
        summary_max_tokens: int = 1024,
        max_summary_input_chars: int = 60_000,
        timeout_s: float = 90.0,
        request_timeout_s: float = 20.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        client: httpx.AsyncClient | None = None,
        summary_client: Any = None,
    ) -> None:
        if not isinstance(max_page_chars, int) or max_page_chars < MIN_MAX_CHARS:
            raise ConfigError(f"max_page_chars must be an integer >= {MIN_MAX_CHARS}, got {max_page_chars!r}")
        if not timeout_s > 0 or not summary_timeout_s > 0:
            raise ConfigError(f"timeout_s and summary_timeout_s must be > 0, got {timeout_s}, {summary_timeout_s}")
        if not isinstance(summary_max_tokens, int) or summary_max_tokens < 1:
            raise ConfigError(f"summary_max_tokens must be an integer >= 1, got {summary_max_tokens!r}")
        if not isinstance(max_summary_input_chars, int) or max_summary_input_chars < 1:
            raise ConfigError(f"max_summary_input_chars must be an integer >= 1, got {max_summary_input_chars!r}")
        has_endpoint = summary_base_url is not None or summary_client is not None
        if has_endpoint != (summary_model is not None):
            raise ConfigError("summarization needs both summary_base_url (or summary_client) and summary_model")
        key = api_key if api_key is not None else os.environ.get(JINA_KEY_ENV, "")
        self.api_key = key.strip() or None
        self.base_url = base_url.rstrip("/")
        self.max_page_chars = max_page_chars
        self.summary_model = summary_model
        self.summary_timeout_s = float(summary_timeout_s)
        self.summary_max_tokens = summary_max_tokens
        self.max_summary_input_chars = max_summary_input_chars
        self.timeout_s = float(timeout_s)
        self.policy = RetryPolicy(max_retries, backoff_s, max_backoff_s, request_timeout_s)
        self._clients: PerLoop[httpx.AsyncClient] = PerLoop(httpx.AsyncClient, client)
        self._summary_clients: PerLoop[Any] | None = None
        if has_endpoint:
            summary_key = summary_api_key or os.environ.get("OPENAI_API_KEY") or "local"

            def make_summary_client() -> Any:
                import openai

                return openai.AsyncOpenAI(
                    base_url=summary_base_url, api_key=summary_key, max_retries=0, timeout=self.summary_timeout_s
                )

            self._summary_clients = PerLoop(make_summary_client, summary_client)

    @property
    def summarizes(self) -> bool:
        """Whether long pages are summarized."""
        return self._summary_clients is not None

    async def aclose(self) -> None:
        """Close the clients of the current event loop (clients passed to the constructor stay open)."""
        await self._clients.aclose()
        if self._summary_clients is not None:
            await self._summary_clients.aclose()

    async def execute(self, arguments: dict[str, Any]) -> str:  # type: ignore[override]
        """Read the page of `{"url": str, "goal"?: str}`.

        Returns:
            The page text when it fits `max_page_chars`; else a summary toward the goal (when summarization is
            configured and works) or the truncated page, preceded by a note saying why.

        Raises:
            ToolError: for a missing or non-http(s) URL, a non-string goal, or when the reader fails (after retries)
                or returns an empty page.
        """
        url, goal = _parse_visit_arguments(arguments)
        deadline = call_deadline(self.timeout_s)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        response = await request_with_retries(
            self._clients.get(),
            "GET",
            f"{self.base_url}/{url}",
            service="Jina Reader",
            policy=self.policy,
            deadline=deadline,
            auth_hint=f"Check the API key ({JINA_KEY_ENV}).",
            secrets=[self.api_key or ""],
            headers=headers,
        )
        page = response.text.strip()
        if not page:
            raise ToolError(f"Jina Reader returned an empty page for {url}")
        if len(page) <= self.max_page_chars:
            return page
        if self._summary_clients is None:
            return self._truncated(page, f"[page of {len(page)} characters, showing the start]")
        try:
            summary = await self._summarize(url, goal or DEFAULT_GOAL, page, deadline)
        except Exception as exc:  # any failure of the summarizer falls back to the raw page
            logger.warning("summary of %s failed (%s: %s); returning the truncated page", url, type(exc).__name__, exc)
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            return self._truncated(page, f"[summarization failed ({reason}); showing the start of the page]")
        header = f"Summary of {url} (page of {len(page)} characters) toward the goal: {goal or DEFAULT_GOAL}\n\n"
        return cap_text(header + summary, self.max_page_chars)

    def _truncated(self, page: str, note: str) -> str:
        return cap_text(f"{note}\n{page}", self.max_page_chars)

    async def _summarize(self, url: str, goal: str, page: str, deadline: float) -> str:
        """A summary of `page` toward `goal` from the OpenAI-compatible endpoint.

        Raises:
            TimeoutError: past `summary_timeout_s` or the call's deadline.
            ValueError: for an empty summary.
            openai.OpenAIError: for a failed request.
        """
        assert self._summary_clients is not None
        client = self._summary_clients.get()
        content = page[: self.max_summary_input_chars]
        cut = f"\n[page cut to its first {len(content)} of {len(page)} characters]" if len(content) < len(page) else ""
        request = {
            "model": self.summary_model,
            "messages": [
                {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
                {"role": "user", "content": f"Goal: {goal}\n\nURL: {url}\n\nPage content:\n{content}{cut}"},
            ],
            "max_tokens": self.summary_max_tokens,
            "temperature": 0.0,
        }
        with anyio.fail_after(max(0.0, min(self.summary_timeout_s, deadline - time.monotonic()))):
            response = await client.chat.completions.create(**request)
        text = (response.choices[0].message.content or "").strip() if response.choices else ""
        if not text:
            raise ValueError("the summarizer returned an empty summary")
        return text


def _parse_visit_arguments(arguments: dict[str, Any]) -> tuple[str, str | None]:
    """`(url, goal)` of `{"url": str, "goal"?: str}`.

    Raises:
        ToolError: for a missing, overlong or non-http(s) URL, or a goal that is not a string.
    """
    url = arguments.get("url") if isinstance(arguments, dict) else None
    if not isinstance(url, str) or not url.strip():
        raise ToolError('visit needs {"url": "https://...", "goal": "<what to look for>"}')
    url = url.strip()
    if not url.lower().startswith(("http://", "https://")) or any(c.isspace() for c in url):
        raise ToolError(f"not a valid http(s) URL: {url[:200]!r}")
    if len(url) > MAX_URL_CHARS:
        raise ToolError(f"URL too long ({len(url)} characters, at most {MAX_URL_CHARS})")
    goal = arguments.get("goal")
    if goal is not None and not isinstance(goal, str):
        raise ToolError("goal must be a string")
    return url, (" ".join(goal.split()) or None) if goal else None


class LocalVisitTool(Tool):
    """Returns a document of the local corpus by id (e.g. `hp00042`) or by exact, case-insensitive title.

    The corpus is shared with `LocalSearchTool` through `load_corpus` (read once per file).

    Args:
        corpus_path: the JSONL corpus of `{"id", "title", "text"}` rows.
        max_chars: the most characters of one observation, truncation marker included (>= 200).

    Raises:
        ConfigError: at construction, for a missing or malformed corpus or a bad `max_chars`.
    """

    name = "visit"
    description = (
        "Open a document of the local corpus by its id (as shown by the search tool, e.g. hp00042) or by its "
        "exact title; returns the full text."
    )
    parameters = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "The document id from a search result, e.g. hp00042."},
            "title": {"type": "string", "description": "The exact document title (case-insensitive)."},
        },
    }
    timeout_s = 5.0

    def __init__(self, corpus_path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH, *, max_chars: int = 6000) -> None:
        if not isinstance(max_chars, int) or max_chars < MIN_MAX_CHARS:
            raise ConfigError(f"max_chars must be an integer >= {MIN_MAX_CHARS}, got {max_chars!r}")
        self.max_chars = max_chars
        self.corpus = load_corpus(corpus_path)

    def execute(self, arguments: dict[str, Any]) -> str:
        """Look up `{"id": str}` or `{"title": str}` (the id wins when both are given and it is known).

        Returns:
            `[id] title`, a blank line and the text, capped at `max_chars`.

        Raises:
            ToolError: for neither argument, a non-string one, or no such document (the message says how to find
                ids).
        """
        doc_id = arguments.get("id") if isinstance(arguments, dict) else None
        title = arguments.get("title") if isinstance(arguments, dict) else None
        if doc_id is None and title is None:
            raise ToolError('visit needs {"id": "<doc id from search>"} or {"title": "<exact title>"}')
        if (doc_id is not None and not isinstance(doc_id, str)) or (title is not None and not isinstance(title, str)):
            raise ToolError("id and title must be strings")
        doc = (self.corpus.get(doc_id) if doc_id else None) or (self.corpus.find_title(title) if title else None)
        if doc is None:
            wanted = f"id {doc_id!r}" if doc_id else f"title {title!r}"
            if doc_id and title:
                wanted = f"id {doc_id!r} or title {title!r}"
            raise ToolError(
                f"no document with {wanted} in the corpus. Find documents with the search tool: each hit is listed "
                'as "[id] title" (ids look like hp00042); then visit {"id": "<that id>"}.'
            )
        return cap_text(f"[{doc.id}] {doc.title}\n\n{doc.text}", self.max_chars)
