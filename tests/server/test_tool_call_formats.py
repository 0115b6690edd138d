"""The server reads tool calls as the rollout does: Qwen3-Coder XML calls come back as OpenAI `tool_calls` (values
typed by the request's schemas), calls inside `<think>` reasoning do not, arguments that are not a JSON object are
kept, and a captured call is recorded in the format the chat template teaches.

Most tests answer from a script (`ScriptedEngine`, no model) under a Qwen3-Coder-style template; the last one has
the real engine write an XML call and a sketch inside reasoning.
"""

from __future__ import annotations

import copy
import json
import uuid

import httpx
import pytest
from support.engines import ScriptedEngine
from support.server import MODEL_NAME

from agentic_rl.server.app import create_app
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.server.thread import ServerThread

TEMPLATE = "tests/fixtures/templates/qwen3-coder-style.jinja"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city", "days"]}}}  # fmt: skip
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>"
)
SKETCH = (
    '<think>\nI could call\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}\n</tool_call>\n'
    "or\n" + XML_CALL + "\nbut I know it already.\n</think>\n\n"
)
REPLIES = {
    "[xml]": "Let me look it up.\n" + XML_CALL,
    "[sketch]": SKETCH + "It is sunny in Oslo.",
    "[sketch-then-call]": SKETCH + XML_CALL,
    "[string-arguments]": '<tool_call>\n{"name": "get_weather", "arguments": "weather in Oslo"}\n</tool_call>',
}


def _script(question: str, turn: int) -> str:
    return REPLIES[question] if turn == 0 else "It is sunny in Oslo."


@pytest.fixture(scope="module")
def coder_tokenizer(tokenizer):
    """SmolLM2's tokenizer carrying a Qwen3-Coder-style template (XML tool calls)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = open(TEMPLATE).read()
    return tok


@pytest.fixture(scope="module")
def scripted_url(coder_tokenizer):
    serving = OpenAIServing(ScriptedEngine(coder_tokenizer, _script), coder_tokenizer, model_name=MODEL_NAME)
    thread = ServerThread(create_app(serving))
    thread.start()
    yield f"http://{thread.address}"
    thread.stop()


def _chat(base_url: str, messages: list, *, stream: bool = False, tid: str | None = None, **extra) -> dict:
    """The assistant message and finish reason of the first choice (a stream's deltas joined)."""
    body = {"model": MODEL_NAME, "messages": messages, "tools": [WEATHER], "max_tokens": 200, "stream": stream, **extra}
    headers = {"X-Trajectory-Id": tid} if tid else {}
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        return {**choice["message"], "finish_reason": choice["finish_reason"]}
    content, calls, finish = "", {}, None
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        choice = json.loads(line[6:])["choices"][0]
        delta = choice.get("delta", {})
        content += delta.get("content") or ""
        for piece in delta.get("tool_calls") or []:
            call = calls.setdefault(piece["index"], {"function": {"name": "", "arguments": ""}})
            call.update({k: piece[k] for k in ("id", "type") if k in piece})
            call["function"]["name"] += piece.get("function", {}).get("name", "")
            call["function"]["arguments"] += piece.get("function", {}).get("arguments", "")
        finish = choice.get("finish_reason") or finish
    message = {"role": "assistant", "content": content or None, "finish_reason": finish}
    return {**message, "tool_calls": [calls[i] for i in sorted(calls)]} if calls else message


def _ask(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_xml_call_comes_back_as_tool_calls_with_typed_arguments(scripted_url, stream):
    message = _chat(scripted_url, _ask("[xml]"), stream=stream)
    assert message["finish_reason"] == "tool_calls"
    assert message["content"] == "Let me look it up."
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 3}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_call_sketched_inside_reasoning_is_content_not_a_call(scripted_url, stream):
    message = _chat(scripted_url, _ask("[sketch]"), stream=stream)
    assert message["finish_reason"] == "stop"
    assert "tool_calls" not in message or not message["tool_calls"]
    assert message["content"] == REPLIES["[sketch]"]  # not cut at the sketched call


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_only_the_call_after_reasoning_is_returned_and_the_content_keeps_the_reasoning(scripted_url, stream):
    message = _chat(scripted_url, _ask("[sketch-then-call]"), stream=stream)
    assert message["finish_reason"] == "tool_calls"
    assert len(message["tool_calls"]) == 1
    assert message["content"] == SKETCH.rstrip()


def test_a_call_whose_arguments_are_a_plain_string_is_kept(scripted_url):
    message = _chat(scripted_url, _ask("[string-arguments]"))
    assert message["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == "weather in Oslo"


def test_tool_calls_sent_back_continue_the_capture_and_are_recorded_in_the_templates_format(scripted_url):
    tid = f"xml-{uuid.uuid4().hex}"
    messages = _ask("[xml]")
    first = _chat(scripted_url, messages, tid=tid)
    first.pop("finish_reason")
    messages += [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "sunny"}]
    second = _chat(scripted_url, messages, tid=tid)
    assert second["content"] == "It is sunny in Oslo."
    record = httpx.get(f"{scripted_url}/v1/trajectories/{tid}").json()
    steps = record["steps"]
    assert [s["info"]["continued"] for s in steps] == [False, True]  # one exact run
    assert "runs" not in record
    assert steps[0]["action"] == (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>"
        "\n</function>\n</tool_call>"
    )


# A forced sample of the real engine: a call sketched inside reasoning, then a real XML call.
FORCED = (
    r"<think>\nMaybe <tool_call>\n<function=calculator>\n<parameter=expression>\n1 \+ 1\n</parameter>\n</function>\n"
    r"</tool_call>\n</think>\n\n<tool_call>\n<function=calculator>\n<parameter=expression>\n2 \+ 3\n</parameter>\n"
    r"</function>\n</tool_call>"
)
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}  # fmt: skip


def test_the_real_engine_writing_an_xml_call_after_a_sketch_gets_only_the_real_call(engine, coder_tokenizer):
    thread = ServerThread(create_app(OpenAIServing(engine, coder_tokenizer, model_name=MODEL_NAME)))
    thread.start()
    try:
        url = f"http://{thread.address}"
        for stream in (False, True):
            message = _chat(url, _ask("What is 2 + 3?"), stream=stream, tools=[CALCULATOR],
                            structured_outputs={"regex": FORCED})  # fmt: skip
            assert message["finish_reason"] == "tool_calls", message
            (call,) = message["tool_calls"]
            assert call["function"]["name"] == "calculator"
            assert json.loads(call["function"]["arguments"]) == {"expression": "2 + 3"}
            assert message["content"].startswith("<think>\nMaybe <tool_call>") and message["content"].endswith("</think>")
    finally:
        thread.stop()
