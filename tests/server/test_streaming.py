"""Server-sent-event streaming over the real engine: OpenAI's chunk shapes, agreement with plain calls, capture,
and a client that leaves mid-stream."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import openai
import pytest
from support.exact import assert_captured_exactly
from support.server import MODEL_NAME

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "math",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"]}}}]  # fmt: skip
CALL = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "2 \+ 2"\}\}\n</tool_call>'
USER = [{"role": "user", "content": "Say hello."}]


def _events(base_url: str, path: str, body: dict, headers: dict | None = None) -> tuple[httpx.Response, list]:
    """POST a streamed request; the response and its events (`[DONE]` as the string)."""
    events = []
    with httpx.stream("POST", f"{base_url}{path}", json={"model": MODEL_NAME, "stream": True, **body},
                      headers=headers, timeout=300) as r:  # fmt: skip
        if r.status_code != 200:
            r.read()
            return r, []
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return r, events


def _post(base_url: str, path: str, body: dict, **kw) -> dict:
    r = httpx.post(f"{base_url}{path}", json={"model": MODEL_NAME, **body}, timeout=300, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_stream_has_openai_chunks_and_adds_up_to_the_sampled_ids(base_url, tokenizer):
    body = {"messages": USER, "max_tokens": 24, "temperature": 0.0, "logprobs": True, "top_logprobs": 2,
            "stream_options": {"include_usage": True}}  # fmt: skip
    r, events = _events(base_url, "/v1/chat/completions", body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in events[:-1]}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and chunks[0]["prompt_token_ids"]
    choices = [c["choices"][0] for c in chunks]
    ids = [t for c in choices for t in c.get("token_ids", [])]
    logprobs = [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
    finishes = [c["finish_reason"] for c in choices]
    assert finishes[-1] in ("stop", "length") and finishes[:-1] == [None] * (len(finishes) - 1)
    assert len(chunks) > 2  # token by token, not one piece at the end
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = tokenizer.decode(ids[:-1] if finishes[-1] == "stop" else ids)
    assert "".join(c["delta"].get("content", "") for c in choices) == text
    assert [e["logprob"] for e in logprobs] == [lp for c in choices for lp in c.get("sampled_logprobs", [])]
    assert len(logprobs) == len(ids) and all(len(e["top_logprobs"]) == 2 for e in logprobs)
    assert (finishes[-1] == "stop") == (ids[-1] == end)
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": len(chunks[0]["prompt_token_ids"]), "completion_tokens": len(ids),
        "total_tokens": len(chunks[0]["prompt_token_ids"]) + len(ids)}  # fmt: skip


def test_streamed_and_plain_calls_give_the_same_message(base_url):
    """A forced output (the same whatever the numerics) arrives identically streamed and whole."""
    forced = {"messages": USER, "max_tokens": 32, "structured_outputs": {"regex": "Hello, world! 42"}}
    plain = _post(base_url, "/v1/chat/completions", forced)["choices"][0]
    _, events = _events(base_url, "/v1/chat/completions", forced)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1])
    assert streamed == plain["message"]["content"] == "Hello, world! 42"
    assert events[-2]["choices"][0]["finish_reason"] == plain["finish_reason"]


def test_streamed_tool_call_is_assembled_by_the_openai_client(base_url):
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="local", max_retries=0)
    request = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "What is 2 + 2?"}], "tools": TOOLS,
               "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 64, "temperature": 0.0}  # fmt: skip
    with client.chat.completions.stream(**request) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content in (None, "")
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "calculator"
    assert set(json.loads(call.function.arguments)) == {"expression"}
    plain = client.chat.completions.create(**request).choices[0]
    assert plain.finish_reason == "tool_calls" and plain.message.tool_calls[0].function.name == "calculator"


def test_tool_call_deltas_have_index_id_name_then_argument_fragments(base_url):
    _, events = _events(base_url, "/v1/chat/completions", {
        "messages": USER, "tools": TOOLS, "max_tokens": 64, "structured_outputs": {"regex": CALL}})  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in events[:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    head, fragments = calls[0], calls[1:]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "calculator", "arguments": ""}
    assert all(set(f) == {"index", "function"} and f["index"] == 0 for f in fragments)
    assert json.loads("".join(f["function"]["arguments"] for f in fragments)) == {"expression": "2 + 2"}
    assert not any(d.get("content") for d in deltas)
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_completion_stream_holds_back_a_possible_stop_string(base_url, tokenizer):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.0, "stop": ["e"]}
    _, events = _events(base_url, "/v1/completions", body)
    choices = [c["choices"][0] for c in events[:-1]]
    assert {c["object"] for c in events[:-1]} == {"text_completion"}
    pieces = [c["text"] for c in choices]
    ids = [t for c in choices for t in c.get("token_ids", [])]
    full = tokenizer.decode(ids)
    text = "".join(pieces)
    assert "e" not in text  # never sent, not even before the engine saw the whole stop string
    if choices[-1]["finish_reason"] == "stop":
        assert text == full[: full.index("e")]
    else:
        assert text == full and "e" not in full
    plain = _post(base_url, "/v1/completions", body)["choices"][0]
    assert "e" not in plain["text"]


def test_n_choices_stream_side_by_side(base_url):
    _, events = _events(base_url, "/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 6, "min_tokens": 6, "n": 2, "seed": 3,
                                                      "stream_options": {"include_usage": True}})  # fmt: skip
    chunks, usage = events[:-2], events[-2]
    by_index: dict[int, list] = {0: [], 1: []}
    for c in chunks:
        (choice,) = c["choices"]
        by_index[choice["index"]].append(choice)
    for choices in by_index.values():
        assert choices[-1]["finish_reason"] == "length"
        assert sum(len(c.get("token_ids", [])) for c in choices) == 6
    assert usage["usage"]["completion_tokens"] == 12


def test_a_client_that_leaves_mid_stream_aborts_its_engine_request(base_url, engine):
    body = {"model": MODEL_NAME, "stream": True, "prompt": "Count:", "max_tokens": 1500, "min_tokens": 1500}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=300) as r:
        lines = r.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received and engine.in_flight_requests >= 1  # still generating
    deadline = time.monotonic() + 60
    while engine.in_flight_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.in_flight_requests == 0
    assert httpx.get(f"{base_url}/health").status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER, "max_token": 3}, "max_token"),
        ({"messages": USER, "structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
        ({"messages": USER, "tools": TOOLS, "tool_choice": "required", "stream_options": {"include_usage": 1}},
         "stream_options.include_usage"),
    ],
)
def test_a_bad_streamed_request_is_a_json_400_before_any_event(base_url, body, param):
    r, events = _events(base_url, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["param"] == param and events == []


def test_streamed_tool_loop_is_captured_exactly_like_a_plain_one(base_url, tokenizer):
    tid = f"stream-{uuid.uuid4().hex}"
    headers = {"X-Trajectory-Id": tid}
    messages = [{"role": "user", "content": "What is 2 + 2? Use the calculator."}]
    _, events = _events(base_url, "/v1/chat/completions", {
        "messages": messages, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "calculator"}},
        "max_tokens": 64, "temperature": 0.0}, headers)  # fmt: skip
    deltas = [c["choices"][0]["delta"] for c in events[:-1]]
    head, *fragments = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assistant = {"role": "assistant", "content": None, "tool_calls": [{
        "id": head["id"], "type": "function", "function": {
            "name": head["function"]["name"], "arguments": "".join(f["function"]["arguments"] for f in fragments)}}]}
    messages += [assistant, {"role": "tool", "tool_call_id": head["id"], "content": "4"}]
    _, events = _events(base_url, "/v1/chat/completions", {
        "messages": messages, "tools": TOOLS, "tool_choice": "none", "max_tokens": 16}, headers)  # fmt: skip
    record = httpx.get(f"{base_url}/v1/trajectories/{tid}").json()
    assert_captured_exactly(record, tokenizer, calls=2)
    assert [s["info"]["streamed"] for s in record["steps"]] == [True, True]
    second_ids = [t for c in events[:-1] for t in c["choices"][0].get("token_ids", [])]
    assert record["steps"][1]["response_ids"] == second_ids
