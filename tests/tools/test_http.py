"""Tests of agentic_rl.tools.http helpers; the retrying request is tested end to end through the tools in
test_search.py and test_visit.py (against a loopback fake), here only its edges."""

from __future__ import annotations

import logging
import time

import anyio
import httpx
import pytest
from support.fake_web import SERPER_KEY, FakeWeb, fake_web_fixture, fake_web_server_fixture  # noqa: F401  (fixtures)

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.http import (
    PerLoop,
    RedactQueryKeyFilter,
    RetryPolicy,
    call_deadline,
    error_detail,
    install_httpx_log_redaction,
    redact,
    request_with_retries,
    require_api_key,
    retry_after_s,
)


def response(status: int, body: object = None, text: str = "", headers: dict[str, str] | None = None):
    if body is not None:
        return httpx.Response(status, json=body, headers=headers)
    return httpx.Response(status, text=text, headers=headers)


def test_require_api_key_prefers_the_argument_then_the_environment(monkeypatch):
    monkeypatch.setenv("SOME_KEY", "  from-env ")
    assert require_api_key(None, "SOME_KEY", "Tool") == "from-env"
    assert require_api_key(" given ", "SOME_KEY", "Tool") == "given"
    monkeypatch.delenv("SOME_KEY")
    with pytest.raises(ConfigError, match="Tool needs an API key: set the SOME_KEY"):
        require_api_key(None, "SOME_KEY", "Tool")
    with pytest.raises(ConfigError):
        require_api_key("  ", "SOME_KEY", "Tool")


def test_error_detail_takes_the_error_field_collapses_whitespace_and_redacts():
    assert error_detail(response(400, {"error": {"message": "bad  key sk-123\n"}}), ["sk-123"]) == "bad key ***"
    assert error_detail(response(400, {"message": "", "detail": "the detail"})) == "the detail"
    assert error_detail(response(500, text="plain   body")) == "plain body"
    assert len(error_detail(response(500, text="x" * 1000))) == 300
    assert redact("a secret and secret", ["secret", ""]) == "a *** and ***"


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("2.5", 2.5), ("-1", 0.0), ("Wed, 21 Oct 2015", None)])
def test_retry_after_s(value, expected):
    assert retry_after_s(response(429, headers={"Retry-After": value} if value else None)) == expected


def test_retry_policy_validates_and_counts_attempts():
    assert RetryPolicy(max_retries=2).attempts == 3
    for bad in ({"max_retries": -1}, {"max_retries": True}, {"backoff_s": -1}, {"request_timeout_s": 0}):
        with pytest.raises(ConfigError):
            RetryPolicy(**bad)


def test_call_deadline_leaves_a_margin_inside_the_timeout():
    now = time.monotonic()
    assert now + 9.5 <= call_deadline(10.0) <= time.monotonic() + 9.5
    assert now + 0.95 <= call_deadline(1.0) <= time.monotonic() + 0.95


def test_httpx_log_redaction_blanks_query_keys_once():
    install_httpx_log_redaction()
    install_httpx_log_redaction()
    filters = [f for f in logging.getLogger("httpx").filters if isinstance(f, RedactQueryKeyFilter)]
    assert len(filters) == 1
    record = logging.LogRecord("httpx", logging.INFO, "", 0, "HTTP Request: %s %s", ("GET", "/s?q=1&api_key=k1"), None)
    assert filters[0].filter(record) and record.getMessage() == "HTTP Request: GET /s?q=1&api_key=***"


def test_per_loop_builds_one_object_per_event_loop_and_closes_it():
    class Client:
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    holder = PerLoop(Client)

    async def use() -> Client:
        first = holder.get()
        assert holder.get() is first
        return first

    one, two = anyio.run(use), anyio.run(use)
    assert one is not two

    async def close() -> Client:
        obj = holder.get()
        await holder.aclose()
        return obj

    assert anyio.run(close).closed
    fixed = Client()
    assert anyio.run(lambda: _get(PerLoop(Client, fixed))) is fixed


async def _get(holder: PerLoop) -> object:
    return holder.get()


async def test_a_deadline_already_past_makes_no_request(fake_web: FakeWeb):
    async with httpx.AsyncClient() as client:
        with pytest.raises(ToolError, match=r"Svc: out of time after 0 attempt\(s\); last error: no attempt made"):
            await request_with_retries(client, "POST", f"{fake_web.url('serper')}/search", service="Svc",
                                       deadline=time.monotonic() - 1, headers={"X-API-KEY": SERPER_KEY})  # fmt: skip
    assert fake_web.count("serper") == 0


async def test_an_invalid_url_is_not_retried():
    async with httpx.AsyncClient() as client:
        with pytest.raises(ToolError, match="Svc: request failed: UnsupportedProtocol"):
            await request_with_retries(client, "GET", "ftp://example.invalid/x", service="Svc")


async def test_retries_are_logged_and_the_last_error_is_reported(fake_web: FakeWeb, caplog):
    fake_web.plan("serper", 503, 503)
    policy = RetryPolicy(max_retries=1, backoff_s=0.01, max_backoff_s=0.01)
    async with httpx.AsyncClient() as client:
        with caplog.at_level(logging.INFO, logger="agentic_rl.tools.http"):
            with pytest.raises(ToolError, match=r"^Svc: HTTP 503 .*\(gave up after 2 attempts\)$"):
                await request_with_retries(client, "POST", f"{fake_web.url('serper')}/search", service="Svc",
                                           policy=policy, headers={"X-API-KEY": SERPER_KEY}, json={"q": "q"})  # fmt: skip
    assert fake_web.count("serper") == 2
    assert "Svc: HTTP 503" in caplog.text and "retry 1/1 in 0.0" in caplog.text
