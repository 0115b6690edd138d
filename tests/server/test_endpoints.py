"""The OpenAI-compatible server over the real engine: wire format, every parameter range, errors, load."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.server import MODEL_NAME

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
COMPLETION = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 8}

# (field, values that must be accepted, values that must be rejected with a 400 naming the field[, paths])
RANGES = [
    ("n", [1, 2], [0, -1, 1.5]),
    ("top_k", [0, 1, 50], [-1, 1.5]),
    ("logprobs", [0, 1, 5], [-1, 21, True], ("/v1/completions",)),
    ("logprobs", [True, False], [1, "yes"], ("/v1/chat/completions",)),
    ("top_logprobs", [0, 5, 20], [-1, 21, 1.5], ("/v1/chat/completions",)),
    ("min_p", [0.0, 0.5, 1.0], [-0.01, 1.01]),
    ("repetition_penalty", [0.5, 1.0, 2.0], [0.0, 2.5]),
    ("detokenize", [True, False], ["yes", 1]),
    ("frequency_penalty", [-2.0, 0.0, 2.0], [-2.01, 2.01]),
    ("presence_penalty", [-2.0, 2.0], [-2.5, 2.5]),
    ("max_tokens", [1, 16], [0, 64001, 2.5]),
    ("min_tokens", [0, 4], [-1, 64001]),
    ("seed", [-(2**63), -1, 0, 65536, 2**64 - 1, 2**70], [1.5, "7", True]),
    ("temperature", [0.0, 1.0, 2.0], [-0.1, 2.1]),
    ("top_p", [1e-8, 0.5, 1.0], [0.0, 1.5]),
]


def _post(base_url: str, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=120, **kw)


def test_health_and_models(base_url):
    assert httpx.get(f"{base_url}/health").json() == {"status": "ok"}
    models = httpx.get(f"{base_url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL_NAME
    assert models["data"][0]["max_model_len"] == 2048
    assert httpx.get(f"{base_url}/v1/models/{MODEL_NAME}").json() == models["data"][0]
    missing = httpx.get(f"{base_url}/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_more_than_16_stop_strings_is_a_400_that_says_so(base_url):
    r = _post(base_url, "/v1/completions", {**COMPLETION, "stop": [str(i) for i in range(17)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert "at most 16 stop strings, got 17" in r.json()["error"]["message"]


def test_completion_returns_text_ids_and_logprobs(base_url, tokenizer):
    r = _post(base_url, "/v1/completions", {**COMPLETION, "logprobs": 2, "min_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL_NAME
    assert body["prompt_token_ids"] == tokenizer.encode(COMPLETION["prompt"])
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == len(choice["sampled_logprobs"]) == 8
    assert choice["text"] == tokenizer.decode(choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == choice["sampled_logprobs"]
    # the 2 most likely tokens, and the sampled one when it is not among them
    tops, tokens = choice["logprobs"]["top_logprobs"], choice["logprobs"]["tokens"]
    assert all(2 <= len(top) <= 3 and token in top for top, token in zip(tops, tokens, strict=True))
    assert body["usage"] == {"prompt_tokens": len(body["prompt_token_ids"]), "completion_tokens": 8,
                             "total_tokens": len(body["prompt_token_ids"]) + 8}  # fmt: skip


def test_chat_completion_renders_the_template_and_stops_on_end_of_turn(base_url, tokenizer):
    r = _post(base_url, "/v1/chat/completions", {**CHAT, "max_tokens": 64, "temperature": 0.0})
    assert r.status_code == 200, r.text
    body = r.json()
    rendered = tokenizer.apply_chat_template(CHAT["messages"], add_generation_prompt=True, tokenize=False)
    assert body["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    if choice["finish_reason"] == "stop":
        assert choice["token_ids"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert "<|im_end|>" not in choice["message"]["content"]


def test_chat_tool_calls_come_back_in_openai_format(base_url):
    regex = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "2 \+ 2"\}\}\n</tool_call>'
    body = {
        **CHAT,
        "max_tokens": 64,
        "structured_outputs": {"regex": regex},
        "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}],
    }
    r = _post(base_url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2 + 2"}
    assert choice["message"]["content"] is None


@pytest.mark.parametrize(
    "case", RANGES, ids=[r[0] + (f"-{r[3][0].split('/')[-1]}" if len(r) > 3 else "") for r in RANGES]
)
def test_every_sampling_parameter_range_is_enforced_with_a_400(base_url, case):
    field, good, bad = case[:3]
    paths = case[3] if len(case) > 3 else ("/v1/completions", "/v1/chat/completions")
    for path, base in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        if path not in paths:
            continue
        extra = {"logprobs": True} if field == "top_logprobs" else {}
        for value in good:
            body = {**base, **extra, field: value}
            if field == "min_tokens":
                body["max_tokens"] = max(value, 1)
            r = _post(base_url, path, body)
            assert r.status_code == 200, (path, field, value, r.text)
        for value in bad:
            r = _post(base_url, path, {**base, **extra, field: value})
            assert r.status_code == 400, (path, field, value, r.text)
            error = r.json()["error"]
            assert error["param"] == field and field in error["message"]
            assert error["type"] == "invalid_request_error"


def test_a_seed_of_any_width_is_folded_into_the_engine_range_and_samples_alike(base_url):
    # OpenAI clients send 64-bit seeds; s and s + (2**31 - 1) fold to the same engine seed, so they sample alike
    folded = 2**63 + 12345
    same = folded - (2**31 - 1) * 7
    bodies = [{**COMPLETION, "temperature": 1.0, "max_tokens": 12, "seed": seed} for seed in (folded, same)]
    ids = []
    for body in bodies:
        r = _post(base_url, "/v1/completions", body)
        assert r.status_code == 200, r.text
        ids.append(r.json()["choices"][0]["token_ids"])
    assert ids[0] == ids[1] and len(ids[0]) == 12


def test_defaults_follow_the_documented_values(serving):
    from agentic_rl.server.protocol import CompletionRequest

    req = CompletionRequest(prompt="x")
    assert (req.n, req.top_k, req.logprobs, req.min_p, req.detokenize, req.frequency_penalty, req.max_tokens,
            req.min_tokens, req.presence_penalty, req.seed, req.temperature, req.top_p, req.repetition_penalty) == (
        1, 50, None, 0.0, False, 0.0, 128, 0, 0.0, None, 0.2, 1.0, 1.0)  # fmt: skip


def test_max_completion_tokens_is_the_chat_name_of_max_tokens(base_url):
    from agentic_rl.server.protocol import ChatCompletionRequest

    messages = CHAT["messages"]
    assert ChatCompletionRequest(messages=messages, max_completion_tokens=7).max_tokens == 7
    assert ChatCompletionRequest(messages=messages, max_completion_tokens=7, max_tokens=7).max_tokens == 7
    r = _post(base_url, "/v1/chat/completions", {"model": MODEL_NAME, "messages": messages, "max_completion_tokens": 3,
                                                  "min_tokens": 3, "temperature": 0.0})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    bad = _post(base_url, "/v1/chat/completions", {**CHAT, "max_completion_tokens": 3})
    assert bad.status_code == 400 and "disagree" in bad.json()["error"]["message"]
    too_many = _post(base_url, "/v1/chat/completions", {"messages": messages, "max_completion_tokens": 0})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": MODEL_NAME}, "prompt"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": 5}, "prompt"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages.0"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages.0"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages.0.role"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ],
)
def test_missing_or_malformed_fields_are_400s_naming_the_field(base_url, path, body, param):
    r = _post(base_url, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_body_and_non_object_body_are_400(base_url):
    r = httpx.post(
        f"{base_url}/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = _post(base_url, "/v1/completions", [1, 2, 3])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_unknown_model_is_404_and_too_long_prompt_is_400(base_url):
    r = _post(base_url, "/v1/completions", {**COMPLETION, "model": "gpt-9"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = _post(base_url, "/v1/completions", {**COMPLETION, "prompt": "word " * 3000})
    assert r.status_code == 400 and "model window" in r.json()["error"]["message"]
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_official_openai_client_talks_to_the_server(base_url):
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT["messages"], max_tokens=8, logprobs=True,
                                          top_logprobs=2)  # fmt: skip
    assert chat.choices[0].message.role == "assistant"
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens
    assert chat.model_extra["prompt_token_ids"]
    completion = client.completions.create(model=MODEL_NAME, prompt="1, 2, 3,", max_tokens=4)
    assert completion.choices[0].text
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=CHAT["messages"], temperature=3.0)
    assert "temperature" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


async def test_sixty_four_concurrent_clients_all_succeed_and_server_stays_healthy(base_url):
    import aiohttp

    async def client(i: int, session: aiohttp.ClientSession) -> list[int]:
        statuses = []
        for j in range(3):
            body = {**CHAT, "max_tokens": 4, "seed": i * 10 + j} if j % 2 else {**COMPLETION, "max_tokens": 4}
            path = "/v1/chat/completions" if j % 2 else "/v1/completions"
            async with session.post(f"{base_url}{path}", json=body) as resp:
                payload = await resp.json()
                statuses.append(resp.status)
                assert payload["choices"][0]["token_ids"]
        return statuses

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64)) as session:
        results = await asyncio.gather(*(client(i, session) for i in range(64)))
        async with session.get(f"{base_url}/health") as resp:
            assert resp.status == 200
    assert [s for statuses in results for s in statuses] == [200] * 192
