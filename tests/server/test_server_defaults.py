"""What the server decides for a client: the defaults of fields a request leaves out (reported in the reply, a cut
at a default `max_tokens` warned once per client, other defaults set by the server), and templates whose tool loop
cannot be followed token-exactly (served, with capture alone told so)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import httpx
import pytest
from support.server import MODEL_NAME

from agentic_rl.errors import ConfigError
from agentic_rl.server.app import DEFAULTS_HEADER, create_app
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.server.thread import ServerThread

USER = [{"role": "user", "content": "Say hello."}]
SEED_DEFAULTS = {"max_tokens": 128, "temperature": 0.2, "top_k": 50}


def _serve(serving: OpenAIServing) -> Iterator[str]:
    thread = ServerThread(create_app(serving))
    thread.start()
    try:
        yield f"http://{thread.address}"
    finally:
        thread.stop()


def _post(url: str, path: str, body: dict, **kw) -> httpx.Response:
    r = httpx.post(f"{url}{path}", json={"model": MODEL_NAME, **body}, timeout=300, **kw)
    assert r.status_code == 200, r.text[:500]
    return r


@pytest.fixture(scope="module")
def short_default(engine, tokenizer) -> Iterator[str]:
    """A server whose own default `max_tokens` is 3 (so a reply that leaves it out is cut)."""
    yield from _serve(OpenAIServing(engine, tokenizer, model_name=MODEL_NAME, defaults={"max_tokens": 3}))


def test_a_request_without_max_tokens_reports_the_defaults_it_took(base_url):
    r = _post(base_url, "/v1/chat/completions", {"messages": USER})
    assert r.json()["server_defaults"] == SEED_DEFAULTS
    assert r.headers[DEFAULTS_HEADER] == "max_tokens=128, temperature=0.2, top_k=50"
    r = _post(base_url, "/v1/completions", {"prompt": "Hello,", "max_tokens": 2, "temperature": 0, "top_k": 0})
    assert "server_defaults" not in r.json() and DEFAULTS_HEADER not in r.headers
    r = _post(base_url, "/v1/chat/completions", {"messages": USER, "max_completion_tokens": 2, "top_k": None})
    assert r.json()["server_defaults"] == {"temperature": 0.2, "top_k": 50}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", timeout=300,
                      json={"model": MODEL_NAME, "messages": USER, "stream": True, "temperature": 0}) as s:  # fmt: skip
        assert s.headers[DEFAULTS_HEADER] == "max_tokens=128, top_k=50"
        first = next(line for line in s.iter_lines() if line.startswith("data: "))
        assert '"server_defaults":{"max_tokens":128,"top_k":50}' in first


def test_a_reply_cut_at_a_default_max_tokens_says_so_and_is_warned_once_per_client(short_default, caplog):
    caplog.set_level(logging.WARNING, logger="agentic_rl.server")
    body = {"messages": [{"role": "user", "content": "Write a long story about a cat."}], "min_tokens": 3}
    for _ in range(2):
        r = _post(short_default, "/v1/chat/completions", body)
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["server_defaults"] == {**SEED_DEFAULTS, "max_tokens": 3}
    warnings = [rec.getMessage() for rec in caplog.records if "max_tokens=3, the server's default" in rec.getMessage()]
    assert len(warnings) == 1, warnings
    _post(short_default, "/v1/chat/completions", body, headers={"User-Agent": "another-agent"})
    _post(short_default, "/v1/chat/completions", {**body, "max_tokens": 3})  # set by the request: no warning
    warnings = [rec.getMessage() for rec in caplog.records if "the server's default" in rec.getMessage()]
    assert len(warnings) == 2 and "another-agent" in warnings[1]


def test_server_defaults_are_checked_and_the_seeds_stay_the_defaults(engine, tokenizer):
    serving = OpenAIServing(engine, tokenizer, model_name=MODEL_NAME)
    assert serving.defaults == {}
    call = serving.prepare({"messages": USER})
    assert call.defaulted == SEED_DEFAULTS and call.sampling.max_tokens == 128 and call.sampling.top_k == 50
    serving.defaults = {"max_tokens": 600, "temperature": 1.0, "top_k": 0, "chat_template_kwargs": {"x": 1}}
    call = serving.prepare({"messages": USER})
    assert call.sampling.max_tokens == 600 and call.sampling.temperature == 1.0 and call.sampling.top_k == -1
    assert call.template_kwargs == {"x": 1} and call.defaulted["chat_template_kwargs"] == {"x": 1}
    assert serving.prepare({"prompt": "Hi"}).defaulted == {"max_tokens": 600, "temperature": 1.0, "top_k": 0}
    assert serving.prepare({"messages": USER, "max_tokens": 5}).sampling.max_tokens == 5
    for bad in ({"max_tokens": 0}, {"model": "other"}, {"temperature": "hot"}, {"stream": True}):
        with pytest.raises(ConfigError):
            serving.defaults = bad


def test_serve_refuses_a_bad_default_before_it_loads_anything(capsys):
    from agentic_rl.cli.command import main

    assert main(["serve", "--model", "no-such-model-anywhere", "--default", "max_tokens=0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
    assert main(["serve", "--default", "max_tokens"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


# ---- templates that cannot be followed token-exactly through a tool loop --------------------------------------


@pytest.fixture(scope="module")
def qwen3_url(engine, qwen3_tokenizer) -> Iterator[tuple[str, OpenAIServing]]:
    serving = OpenAIServing(engine, qwen3_tokenizer, model_name=MODEL_NAME)
    for url in _serve(serving):
        yield url, serving


def test_qwen3_without_thinking_is_served_and_capture_alone_is_told(qwen3_url, qwen3_tokenizer, caplog):
    url, serving = qwen3_url
    no_think = {"enable_thinking": False}
    body = _post(url, "/v1/chat/completions", {"messages": USER, "max_tokens": 4,
                                               "chat_template_kwargs": no_think}).json()  # fmt: skip
    suffix = qwen3_tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    assert body["prompt_token_ids"][-len(suffix) :] == suffix and "capture_warning" not in body
    caplog.set_level(logging.WARNING, logger="agentic_rl.server")
    tid = f"no-think-{uuid.uuid4().hex}"
    messages = list(USER)
    for _ in range(2):
        body = _post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "chat_template_kwargs":
                     no_think}, headers={"X-Trajectory-Id": tid}).json()  # fmt: skip
        assert "opens a <think> block for the model and drops it" in body["capture_warning"]
        messages += [body["choices"][0]["message"], {"role": "tool", "content": "5"}]
    assert len(serving.recorder.build(tid).runs) == 2  # every call its own exact run
    assert sum("are not continued token by token" in r.getMessage() for r in caplog.records) == 1
    plain = _post(url, "/v1/chat/completions", {"messages": USER, "max_tokens": 2}, headers={"X-Trajectory-Id": tid})
    assert "capture_warning" not in plain.json()  # Qwen3 with thinking follows a tool loop


def test_qwen3_without_thinking_as_the_servers_default_answers_a_one_turn_request(engine, qwen3_tokenizer):
    """`agentic-rl serve --default chat_template_kwargs='{"enable_thinking": false}'`: every request renders so."""
    serving = OpenAIServing(engine, qwen3_tokenizer, model_name=MODEL_NAME,
                            defaults={"chat_template_kwargs": {"enable_thinking": False}})  # fmt: skip
    suffix = qwen3_tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    for url in _serve(serving):
        body = _post(url, "/v1/chat/completions", {"messages": USER, "max_tokens": 2}).json()
        assert body["prompt_token_ids"][-len(suffix) :] == suffix
        assert body["server_defaults"]["chat_template_kwargs"] == {"enable_thinking": False}
        body = _post(url, "/v1/chat/completions", {"messages": USER, "max_tokens": 2,
                                                   "chat_template_kwargs": {"enable_thinking": True}}).json()  # fmt: skip
        assert body["prompt_token_ids"][-len(suffix) :] != suffix and "chat_template_kwargs" not in body["server_defaults"]
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        serving.defaults = {"chat_template_kwargs": {"tokenize": True}}
