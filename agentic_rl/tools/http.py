"""HTTP plumbing shared by the web tools (search, visit): API keys, retries, deadlines, error text, log redaction.

`request_with_retries` sends one request through `tenacity`: a per-attempt timeout, bounded retries with
exponential backoff (honouring `Retry-After`) on HTTP 429, 5xx, timeouts and connection errors, no retry on other
4xx, and an overall deadline, so that a clear `ToolError` reaches the model before the environment's own timeout.
Error messages never carry the URL, and API keys are blanked out of them.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

import anyio
import anyio.lowlevel
import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential

from agentic_rl.errors import ConfigError, ToolError, ToolUnavailableError

__all__ = [
    "PerLoop",
    "RedactQueryKeyFilter",
    "RetryPolicy",
    "call_deadline",
    "error_detail",
    "install_httpx_log_redaction",
    "redact",
    "request_with_retries",
    "require_api_key",
    "retry_after_s",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


# ------------------------------------------------------------------------------------------- keys and error text


def require_api_key(explicit: str | None, env_var: str, owner: str) -> str:
    """The API key: `explicit` when given, else the `env_var` environment variable; stripped.

    Raises:
        ConfigError: if the key is missing or blank (the message names `owner` and `env_var`).
    """
    key = explicit if explicit is not None else os.environ.get(env_var, "")
    if not key or not key.strip():
        raise ConfigError(f"{owner} needs an API key: set the {env_var} environment variable or pass api_key=")
    return key.strip()


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every non-empty string of `secrets` replaced by `***`."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def error_detail(response: httpx.Response, secrets: Iterable[str] = ()) -> str:
    """The human-readable error of a failed response: the `error` / `message` / `detail` field, else the body.

    Whitespace is collapsed, the text is cut to 300 characters and `secrets` are blanked out.
    """
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
    return redact(detail[:300], secrets)


def retry_after_s(response: httpx.Response) -> float | None:
    """The response's `Retry-After` in seconds (>= 0), or None when absent or an HTTP date."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: not worth parsing, fall back to our own backoff
        return None


class RedactQueryKeyFilter(logging.Filter):
    """Blanks `api_key=...` in httpx's request log lines (SerpApi takes its key as a query parameter)."""

    _pattern = re.compile(r"(api_key=)[^&\s\"']+")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and any("api_key=" in str(a) for a in record.args):
            record.msg = self._pattern.sub(r"\1***", record.getMessage())
            record.args = ()
        return True


def install_httpx_log_redaction() -> None:
    """Adds a `RedactQueryKeyFilter` to the `httpx` logger (once)."""
    httpx_logger = logging.getLogger("httpx")
    if not any(isinstance(f, RedactQueryKeyFilter) for f in httpx_logger.filters):
        httpx_logger.addFilter(RedactQueryKeyFilter())


# ------------------------------------------------------------------------------------------------------ retries


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

    @property
    def attempts(self) -> int:
        """The most attempts of one request: the first one plus `max_retries`."""
        return self.max_retries + 1


class _RetryableFailure(Exception):
    """One failed attempt that may be retried: a timeout, a connection error, HTTP 429 or 5xx."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _Schedule:
    """Tenacity's wait and stop for one request: exponential backoff with jitter, and the overall deadline.

    The delay before retry number n is `backoff_s * 2 ** (n - 1)`, capped at `max_backoff_s`, times a jitter in
    [0.5, 1], and at least the server's `Retry-After` (itself capped at `max_backoff_s`). It is drawn once per retry
    and shared by the wait and by the deadline check, which gives up when the retry would start past the deadline
    (tenacity may ask for either first).
    """

    def __init__(self, policy: RetryPolicy, deadline: float | None) -> None:
        self.policy = policy
        self.deadline = deadline
        self._exponential = wait_exponential(multiplier=policy.backoff_s, max=policy.max_backoff_s)
        self._delays: dict[int, float] = {}

    def delay(self, state: RetryCallState) -> float:
        """The delay in seconds before the retry that follows attempt `state.attempt_number`."""
        attempt = state.attempt_number
        if attempt not in self._delays:
            delay = self._exponential(state) * random.uniform(0.5, 1.0)
            failure = state.outcome.exception() if state.outcome is not None else None
            if isinstance(failure, _RetryableFailure) and failure.retry_after is not None:
                delay = max(delay, min(failure.retry_after, self.policy.max_backoff_s))
            self._delays[attempt] = delay
        return self._delays[attempt]

    def out_of_time(self, state: RetryCallState) -> bool:
        """True when the next retry would start at or past the deadline."""
        return self.deadline is not None and time.monotonic() + self.delay(state) >= self.deadline


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
        ToolUnavailableError: after the last failed attempt (transport error, timeout, 429 or 5xx), when the deadline
            is reached, or when authentication failed: the service failed, not the call (an infrastructure failure,
            retried by the rollout). The message names the service, the status or error, and the number of attempts.
        ToolError: on another 4xx status (the request itself was rejected) or an unusable URL.
    """
    schedule = _Schedule(policy, deadline)
    made = 0
    last_error = "no attempt made"

    async def attempt() -> httpx.Response:
        nonlocal made, last_error
        timeout = policy.request_timeout_s
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ToolUnavailableError(f"{service}: out of time after {made} attempt(s); last error: {last_error}")
            timeout = min(timeout, remaining)
        made += 1
        try:
            return await _attempt(client, method, url, timeout, service, auth_hint, secrets, kwargs)
        except _RetryableFailure as failure:
            last_error = failure.reason
            raise

    def log_retry(state: RetryCallState) -> None:
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        logger.info(
            "%s: %s; retry %d/%d in %.2f s", service, last_error, state.attempt_number, policy.max_retries, delay
        )

    def give_up(state: RetryCallState) -> NoReturn:
        if made < policy.attempts:  # stopped by the deadline
            raise ToolUnavailableError(f"{service}: out of time after {made} attempt(s); last error: {last_error}")
        raise ToolUnavailableError(f"{service}: {last_error} (gave up after {made} attempt{'s' if made > 1 else ''})")

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts) | schedule.out_of_time,
        wait=schedule.delay,
        retry=retry_if_exception_type(_RetryableFailure),
        sleep=anyio.sleep,
        before_sleep=log_retry,
        retry_error_callback=give_up,
    )
    return await retrying(attempt)


_RETRYABLE_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


async def _attempt(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    timeout: float,
    service: str,
    auth_hint: str,
    secrets: Sequence[str],
    kwargs: dict[str, Any],
) -> httpx.Response:
    """One attempt of `request_with_retries`, limited to `timeout` seconds.

    Raises:
        _RetryableFailure: for a failure worth retrying.
        ToolError: for any other failure.
    """
    try:
        response = await client.request(method, url, timeout=timeout, **kwargs)
    except httpx.ConnectTimeout as exc:
        raise _RetryableFailure(f"could not connect (timed out after {timeout:.3g} s)") from exc
    except httpx.TimeoutException as exc:
        raise _RetryableFailure(f"timed out after {timeout:.3g} s") from exc
    except _RETRYABLE_TRANSPORT as exc:
        kind = "could not connect" if isinstance(exc, httpx.ConnectError) else "network error"
        raise _RetryableFailure(redact(f"{kind}: {type(exc).__name__}: {exc}", secrets)) from exc
    except httpx.HTTPError as exc:  # invalid URL, unsupported protocol, ...: retrying cannot help
        raise ToolError(redact(f"{service}: request failed: {type(exc).__name__}: {exc}", secrets)) from exc
    status = response.status_code
    if response.is_success:
        return response
    detail = error_detail(response, secrets)
    reason = f"HTTP {status} {response.reason_phrase}".rstrip() + (f": {detail}" if detail else "")
    if status in (401, 403):
        hint = f" {auth_hint}" if auth_hint else ""
        raise ToolUnavailableError(f"{service}: authentication failed ({reason}).{hint}")
    if status != 429 and status < 500:
        raise ToolError(f"{service}: request rejected ({reason})")
    raise _RetryableFailure(reason, retry_after_s(response))


# ------------------------------------------------------------------------------------- clients and deadlines


class PerLoop(Generic[T]):
    """One object (an HTTP client) per running event loop: async clients are bound to the loop that created them.

    When the loop changes (a new `anyio.run`, a new test), the next `get()` builds a fresh object; the old one is
    dropped with its loop.

    Args:
        factory: builds the object for a loop.
        fixed: a caller-provided object returned by every `get()` instead (and never closed by `aclose`).
    """

    def __init__(self, factory: Callable[[], T], fixed: T | None = None) -> None:
        self._factory = factory
        self._fixed = fixed
        self._token: Any = None
        self._obj: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """The object of the current event loop (built on first use in that loop)."""
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


def call_deadline(timeout_s: float) -> float:
    """A `time.monotonic()` deadline slightly inside `timeout_s`, so our own error wins over the environment's."""
    return time.monotonic() + timeout_s - min(0.5, 0.05 * timeout_s)
