"""Tool calls in the chat template's own format on the server: `tool_choice` constrains the output to that format
(Hermes JSON, Qwen3-Coder XML, Llama 3 JSON, Mistral `[TOOL_CALLS]`), the reply's `tool_calls` are read from it, and
a captured call is recorded in it.

The grammar checks compile the server's constraint with xgrammar on SmolLM2's tokenizer (no engine); a scripted
engine (no model) answers under Llama 3.2's template; the last test has the real engine write calls under the
Qwen3-Coder-style template, where `tool_choice="required"` must give XML calls.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from support.chat_templates import FAMILIES, family_tokenizer
from support.server import MODEL_NAME
from test_tool_choice import CALCULATOR, TOOLS  # the same two tools

from agentic_rl.engine.base import Generation
from agentic_rl.parser import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    PYTHON_TAG,
    QWEN3_CODER,
    TOOL_CALL_FORMATS,
    ToolCall,
    format_tool_calls,
    parse_tool_calls,
)
from agentic_rl.server.app import create_app
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.server.thread import ServerThread

ASK = [{"role": "user", "content": "What is 2 + 3? And the weather in Oslo for 3 days?"}]
CALC_CALL = ("calculator", {"expression": "2 + 3"}, "abcDEF123")
WEATHER_CALL = ("get_weather", {"city": "Oslo", "days": 3}, "XYZxyz789")
NAMED = {"type": "function", "function": {"name": "get_weather"}}


# ---- the grammar ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def accepts(tokenizer):
    """`accepts(call_format, body, text)`: whether the server's constraint for a chat `body` under a template of
    `call_format` lets a turn be `text`, then end."""
    import xgrammar

    from agentic_rl.server.constraints import output_constraint
    from agentic_rl.server.protocol import ChatCompletionRequest, parse_request

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[end]))

    def check(call_format: str, body: dict, text: str) -> bool:
        request = parse_request(ChatCompletionRequest, {"messages": ASK, "tools": TOOLS, **body})
        tag = output_constraint(request, max_tool_calls=3, call_format=call_format).params.structural_tag
        matcher = xgrammar.GrammarMatcher(compiler.compile_structural_tag(tag))
        return matcher.accept_string(text) and matcher.accept_token(end)

    return check


@pytest.mark.parametrize("call_format", TOOL_CALL_FORMATS)
def test_required_calls_are_written_in_the_templates_format(accepts, call_format):
    one, two = format_tool_calls([WEATHER_CALL], call_format), format_tool_calls([CALC_CALL, WEATHER_CALL], call_format)
    required = {"tool_choice": "required"}
    assert accepts(call_format, required, one) and accepts(call_format, required, two)
    assert not accepts(call_format, required, "It is sunny.")
    assert not accepts(call_format, {**required, "parallel_tool_calls": False}, two)
    assert accepts(call_format, {**required, "parallel_tool_calls": False}, one)
    assert accepts(call_format, {"tool_choice": NAMED}, one)
    assert not accepts(call_format, {"tool_choice": NAMED}, format_tool_calls([CALC_CALL], call_format))
    for other in set(TOOL_CALL_FORMATS) - {call_format}:  # never another family's format
        assert not accepts(call_format, required, format_tool_calls([WEATHER_CALL], other))
    for text in (one, two):  # what the grammar allows reads back as the calls
        found = parse_tool_calls(text, TOOLS, call_format)
        assert all(isinstance(c, ToolCall) for c in found) and len(found) == text.count('"name"') + text.count("<function=")


@pytest.mark.parametrize("call_format", TOOL_CALL_FORMATS)
def test_arguments_must_fit_the_schema_in_every_format(accepts, call_format):
    wrong = format_tool_calls([("get_weather", {"city": "Oslo", "days": "three"}, "abcDEF123")], call_format)
    missing = format_tool_calls([("get_weather", {"city": "Oslo"}, "abcDEF123")], call_format)
    assert not accepts(call_format, {"tool_choice": "required"}, wrong)
    assert not accepts(call_format, {"tool_choice": "required"}, missing)


def test_mistral_ids_are_nine_alphanumerics(accepts):
    assert not accepts(MISTRAL, {"tool_choice": "required"}, format_tool_calls([WEATHER_CALL], MISTRAL).replace("XYZxyz789", "XYZ"))
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}, "id": "call_1234"}]'
    assert not accepts(MISTRAL, {"tool_choice": "required"}, text)


@pytest.mark.parametrize("call_format", TOOL_CALL_FORMATS)
def test_auto_without_parallel_calls_allows_an_answer_or_one_call(accepts, call_format):
    body = {"parallel_tool_calls": False}
    assert accepts(call_format, body, "It is sunny in Oslo.")
    assert accepts(call_format, body, format_tool_calls([WEATHER_CALL], call_format))
    assert not accepts(call_format, body, format_tool_calls([CALC_CALL, WEATHER_CALL], call_format))


def test_llama3_text_then_a_call_is_not_allowed(accepts):
    """Llama 3's templates read text before the JSON as an answer: a constrained turn is one or the other."""
    call = format_tool_calls([WEATHER_CALL], LLAMA3_JSON)
    assert not accepts(LLAMA3_JSON, {"parallel_tool_calls": False}, "Let me look. " + call)
    assert accepts(HERMES, {"parallel_tool_calls": False}, "Let me look. " + format_tool_calls([WEATHER_CALL], HERMES))


@pytest.mark.parametrize("call_format", TOOL_CALL_FORMATS)
def test_none_keeps_the_formats_calls_out(accepts, call_format):
    assert accepts(call_format, {"tool_choice": "none"}, "It is sunny.")
    assert not accepts(call_format, {"tool_choice": "none"}, format_tool_calls([WEATHER_CALL], call_format))


def test_tool_choice_outputs_takes_the_format():
    from agentic_rl.server.constraints import tool_choice_outputs

    tags = {f: json.loads(tool_choice_outputs(TOOLS, "required", call_format=f).structural_tag) for f in TOOL_CALL_FORMATS}
    assert json.loads(tool_choice_outputs(TOOLS, "required").structural_tag) == tags[HERMES]
    assert "<function=calculator>" in json.dumps(tags[QWEN3_CODER]) and "qwen_xml" in json.dumps(tags[QWEN3_CODER])
    assert '\\"parameters\\": ' in json.dumps(tags[LLAMA3_JSON]) and "[TOOL_CALLS][" in json.dumps(tags[MISTRAL])


# ---- a scripted engine under Llama 3.2's template --------------------------------------------------------------

CALC_JSON = '{"name": "calculator", "parameters": {"expression": "2 + 3"}}'
REPLIES = {
    "[bare]": CALC_JSON,
    "[tagged]": "Let me compute.\n" + PYTHON_TAG + CALC_JSON,
    "[json-answer]": '{"answer": 5}',
    "[named-answer]": '{"name": "Bob", "age": 3}',
}


class LlamaScript:
    """Turn k (assistant headers in the prompt, minus one) answers `REPLIES[tag]` for the question's tag, then
    `"It is 5."`; closed by `<|eot_id|>`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|eot_id|>")
        self.weight_version = 0

    @property
    def max_model_len(self) -> int:
        return 8192

    async def generate(self, prompt_ids: Sequence[int], sampling: Any) -> Generation:
        text = self.tokenizer.decode(list(prompt_ids))
        turn = text.count("<|start_header_id|>assistant<|end_header_id|>") - 1
        tag = next((t for t in REPLIES if t in text), "[bare]")
        reply = REPLIES[tag] if turn == 0 else "It is 5."
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.end]
        return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop", stop_reason=self.end)


@pytest.fixture(scope="module")
def llama_url(tokenizer):
    (family,) = [f for f in FAMILIES if f.name == "Llama 3.2"]
    tok = family_tokenizer(copy.deepcopy(tokenizer), family)
    serving = OpenAIServing(LlamaScript(tok), tok, model_name=MODEL_NAME)
    thread = ServerThread(create_app(serving))
    thread.start()
    yield f"http://{thread.address}"
    thread.stop()


def _chat(url: str, messages: list, *, stream: bool = False, tid: str | None = None) -> dict:
    body = {"model": MODEL_NAME, "messages": messages, "tools": [CALCULATOR], "max_tokens": 200, "stream": stream}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Trajectory-Id": tid} if tid else {}, timeout=60)
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        return {**choice["message"], "finish_reason": choice["finish_reason"]}
    content, calls, finish = "", [], None
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            content += choice.get("delta", {}).get("content") or ""
            for piece in choice.get("delta", {}).get("tool_calls") or []:
                if "id" in piece:
                    calls.append({"id": piece["id"], "function": {"name": piece["function"]["name"], "arguments": ""}})
                else:
                    calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
            finish = choice.get("finish_reason") or finish
    return {"content": content or None, "tool_calls": calls or None, "finish_reason": finish}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("tag", "content"), [("[bare]", None), ("[tagged]", "Let me compute.")])
def test_llama3_calls_come_back_as_tool_calls(llama_url, stream, tag, content):
    message = _chat(llama_url, [{"role": "user", "content": f"{tag} What is 2 + 3?"}], stream=stream)
    assert message["finish_reason"] == "tool_calls"
    assert message["content"] == content
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2 + 3"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("tag", ["[json-answer]", "[named-answer]"])
def test_a_json_final_answer_stays_an_answer(llama_url, stream, tag):
    message = _chat(llama_url, [{"role": "user", "content": f"{tag} Answer in JSON."}], stream=stream)
    assert message["finish_reason"] == "stop" and not message.get("tool_calls")
    assert message["content"] == REPLIES[tag]


def test_a_llama3_call_is_captured_in_the_templates_format(llama_url):
    tid = f"llama-{uuid.uuid4().hex}"
    messages: list[dict] = [{"role": "user", "content": "[bare] What is 2 + 3?"}]
    first = _chat(llama_url, messages, tid=tid)
    first.pop("finish_reason")
    messages += [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "5"}]
    assert _chat(llama_url, messages, tid=tid)["content"] == "It is 5."
    record = httpx.get(f"{llama_url}/v1/trajectories/{tid}").json()
    assert [s["info"]["continued"] for s in record["steps"]] == [False, True]
    assert record["steps"][0]["action"] == CALC_JSON
    assert record["steps"][1]["action"] == ""


# ---- the real engine under the Qwen3-Coder-style template ------------------------------------------------------


def test_the_real_engine_forced_to_call_writes_xml_calls(engine, tokenizer):
    coder = copy.deepcopy(tokenizer)
    coder.chat_template = open("tests/fixtures/templates/qwen3-coder-style.jinja").read()
    thread = ServerThread(create_app(OpenAIServing(engine, coder, model_name=MODEL_NAME)))
    thread.start()
    try:
        url = f"http://{thread.address}"
        for choice, seed in (("required", 3), (NAMED, 11)):
            body = {"model": MODEL_NAME, "messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 160,
                    "temperature": 1.0, "seed": seed, "parallel_tool_calls": False}  # fmt: skip
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            out = r.json()["choices"][0]
            text = tokenizer.decode(out["token_ids"], skip_special_tokens=True)
            assert text.startswith("<tool_call>\n<function=" + ("get_weather>" if choice == NAMED else ""))
            if out["finish_reason"] == "tool_calls":
                (call,) = out["message"]["tool_calls"]
                arguments = json.loads(call["function"]["arguments"])
                schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call["function"]["name"]]
                assert set(schema["required"]) <= set(arguments) <= set(schema["properties"])
                assert all(isinstance(v, int if schema["properties"][k]["type"] == "integer" else str)
                           for k, v in arguments.items())  # fmt: skip
    finally:
        thread.stop()
