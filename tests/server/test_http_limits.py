"""Bodies the server must not let stall it: too large (413, unread), large but allowed (prepared off the event loop,
so `/health` and other calls answer meanwhile), nested too deep; and clients that leave mid-body or mid-stream,
which are routine (no traceback in the log)."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from support.server import MODEL_NAME

from agentic_rl.server.app import create_app
from agentic_rl.server.serving import DEFAULT_MAX_BODY_BYTES, OpenAIServing
from agentic_rl.server.thread import ServerThread

LIMIT = 2**20  # the limited server's body limit, in bytes
BIG_PROMPT = 200_000  # characters of a prompt that the gated tokenizer holds until released


class _Gate:
    """Holds the tokenizing of any prompt over `BIG_PROMPT` characters until `release` is set."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.entered = threading.Event()
        self.release = threading.Event()
        encode = tokenizer.encode

        def gated(text, *args, **kwargs):
            if isinstance(text, str) and len(text) >= BIG_PROMPT:
                self.entered.set()
                assert self.release.wait(120), "the test never released the tokenizer"
            return encode(text, *args, **kwargs)

        tokenizer.encode = gated


@pytest.fixture(scope="module")
def gate(model_dir) -> _Gate:
    from transformers import AutoTokenizer

    return _Gate(AutoTokenizer.from_pretrained(str(model_dir)))


@pytest.fixture(scope="module")
def limited(engine, gate) -> Iterator[tuple[str, _Gate]]:
    """A server with a 1 MiB body limit whose tokenizer is gated (`_Gate`)."""
    serving = OpenAIServing(engine, gate.tokenizer, model_name=MODEL_NAME, max_body_bytes=LIMIT)
    thread = ServerThread(create_app(serving))
    thread.start()
    yield f"http://{thread.address}", gate
    thread.stop()


@contextmanager
def _server_log(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture every record of the server's loggers, uvicorn's included (uvicorn's do not reach the root logger).
    Entered in the test itself: pytest captures each test phase with a handler of its own."""
    caplog.set_level(logging.DEBUG, logger="agentic_rl.server")
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        uvicorn_logger.removeHandler(caplog.handler)


def _wait_for(caplog: pytest.LogCaptureFixture, text: str) -> None:
    """Wait until the server logs `text` (an order between threads, with a generous bound on a busy machine)."""
    for _ in range(1200):
        if any(text in r.getMessage() for r in caplog.records):
            return
        threading.Event().wait(0.05)
    pytest.fail(f"the server never logged {text!r}")


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


def test_a_10_mb_body_gets_413_unread(base_url):
    assert DEFAULT_MAX_BODY_BYTES < 10_000_000
    body = json.dumps({"model": MODEL_NAME, "prompt": "word " * 2_000_000}).encode()
    r = httpx.post(f"{base_url}/v1/completions", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == 413 and error["type"] == "request_too_large" and str(DEFAULT_MAX_BODY_BYTES) in error["message"]
    assert httpx.get(f"{base_url}/health", timeout=60).status_code == 200


def test_huge_bodies_are_413_with_a_length_or_without_one(limited):
    url, _ = limited
    messages = [{"role": "user", "content": "hi"}] * 60_000  # a huge messages array
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "description": "x" * 100} for i in range(20_000)}}}}]  # a huge tool schema
    for body in ({"messages": messages}, {"messages": messages[:1], "tools": tools}):
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL_NAME, **body}, timeout=60)
        assert r.status_code == 413, r.text[:300]
    raw = json.dumps({"model": MODEL_NAME, "messages": messages}).encode()
    chunks = (raw[i : i + 65536] for i in range(0, len(raw), 65536))  # no Content-Length: counted as it arrives
    r = httpx.post(f"{url}/v1/chat/completions", content=chunks, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def test_a_json_bomb_is_a_400_and_a_body_at_the_limit_is_read(limited):
    url, _ = limited
    r = httpx.post(f"{url}/v1/completions", content=b"[" * (LIMIT - 1), timeout=60)
    assert r.status_code == 400 and "nests deeper" in r.json()["error"]["message"]
    body = {"model": MODEL_NAME, "prompt": "Hello,", "max_tokens": 1}
    raw = json.dumps(body).encode()
    body["user"] = "u" * (LIMIT - len(raw) - len(', "user": ""'))  # an ignored field fills the body to the limit
    raw = json.dumps(body).encode()
    assert len(raw) == LIMIT
    r = httpx.post(f"{url}/v1/completions", content=raw, headers={"Content-Type": "application/json"}, timeout=300)
    assert r.status_code == 200, r.text[:300]


def test_health_and_other_calls_answer_while_a_large_prompt_is_tokenized(limited):
    url, gate = limited
    results: dict[str, httpx.Response] = {}

    def big_call() -> None:
        body = {"model": MODEL_NAME, "prompt": "word " * (BIG_PROMPT // 5 + 1), "max_tokens": 1}
        results["big"] = httpx.post(f"{url}/v1/completions", json=body, timeout=300)

    worker = threading.Thread(target=big_call)
    worker.start()
    try:
        assert gate.entered.wait(120), "the large prompt never reached the tokenizer"
        # The large prompt is being tokenized (held by the gate): the event loop still answers.
        assert httpx.get(f"{url}/health", timeout=120).status_code == 200
        small = httpx.post(f"{url}/v1/completions", json={"model": MODEL_NAME, "prompt": "Hello,", "max_tokens": 1},
                           timeout=300)  # fmt: skip
        assert small.status_code == 200, small.text[:300]
        assert "big" not in results
    finally:
        gate.release.set()
        worker.join(300)
    big = results["big"]
    assert big.status_code == 400 and "model window" in big.json()["error"]["message"]  # tokenized, then refused


def test_a_client_that_leaves_mid_body_leaves_no_traceback(limited, caplog):
    url, _ = limited
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with _server_log(caplog):
        for _ in range(3):
            with socket.create_connection((host, int(port))) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json"
                             b"\r\nContent-Length: 5000\r\n\r\n{\"messages\": [")  # fmt: skip
        _wait_for(caplog, "disconnected before sending its whole request")
        assert httpx.get(f"{url}/health", timeout=60).status_code == 200
        _no_tracebacks(caplog)


def test_a_client_that_leaves_mid_stream_leaves_no_traceback(limited, caplog):
    url, _ = limited
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Count to a hundred."}], "stream": True,
            "max_tokens": 1000, "min_tokens": 1000}  # fmt: skip
    with _server_log(caplog):
        with httpx.Client(timeout=300) as client, client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            next(r.iter_lines())
        _wait_for(caplog, "a stream was left before its end")
        assert httpx.get(f"{url}/health", timeout=60).status_code == 200
        _no_tracebacks(caplog)
