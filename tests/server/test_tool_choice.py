"""`tool_choice`, `parallel_tool_calls` and `response_format`, enforced by the engine's structured outputs.

The model samples freely inside each constraint, so every test asserts what the constraint guarantees for any
sample (the output's shape), never what the model chose to write.
"""

from __future__ import annotations

import json

import httpx
import pytest
from support.server import MODEL_NAME

from agentic_rl.parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, parse_tool_calls

CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                             "required": ["expression"]}}}  # fmt: skip
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city", "days"]}}}  # fmt: skip
TOOLS = [CALCULATOR, WEATHER]
ASK = [{"role": "user", "content": "What is 12 * 7? And is it sunny in Paris?"}]
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
                 "additionalProperties": False}  # fmt: skip


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _chat(base_url: str, **body) -> dict:
    r = httpx.post(f"{base_url}/v1/chat/completions",
                   json={"model": MODEL_NAME, "messages": ASK, "max_tokens": 96, **body}, timeout=300)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _sampled_text(choice: dict, tokenizer) -> str:
    return tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


def _assert_valid_call(call: dict, names: set[str]) -> None:
    """An OpenAI tool call of one of `names` whose arguments have exactly the schema's properties and types."""
    assert call["type"] == "function" and call["id"].startswith("call_")
    name = call["function"]["name"]
    assert name in names
    arguments = json.loads(call["function"]["arguments"])
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[name]
    assert set(schema["required"]) <= set(arguments) <= set(schema["properties"])
    types = {"string": str, "integer": int}
    assert all(type(arguments[k]) is types[schema["properties"][k]["type"]] for k in arguments)


def test_required_without_parallel_calls_is_exactly_one_valid_call(base_url, tokenizer):
    choice = _chat(base_url, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=7)
    assert _sampled_text(choice, tokenizer).startswith(TOOL_CALL_OPEN)
    assert choice["finish_reason"] in ("tool_calls", "length")
    if choice["finish_reason"] == "tool_calls":
        (call,) = choice["message"]["tool_calls"]
        _assert_valid_call(call, {"calculator", "get_weather"})
        assert choice["message"]["content"] is None


def test_required_with_parallel_calls_writes_nothing_but_calls(base_url, tokenizer):
    choice = _chat(base_url, tools=TOOLS, tool_choice="required", temperature=1.0, seed=3, max_tokens=160)
    text = _sampled_text(choice, tokenizer)
    assert text.startswith(TOOL_CALL_OPEN)
    if choice["finish_reason"] == "tool_calls":  # also a turn cut by max_tokens after a call it completed
        calls = choice["message"]["tool_calls"]
        assert len(calls) == text.count(TOOL_CALL_CLOSE) >= 1  # the calls the turn completed
        if choice["token_ids"][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>"):  # it ended: every call opened
            assert len(calls) == text.count(TOOL_CALL_OPEN)
        for call in calls:
            _assert_valid_call(call, {"calculator", "get_weather"})
        complete = text[: text.rfind(TOOL_CALL_CLOSE) + len(TOOL_CALL_CLOSE)]
        assert all(isinstance(c, ToolCall) for c in parse_tool_calls(complete))


def test_a_named_function_is_the_one_called(base_url, tokenizer):
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = _chat(base_url, tools=TOOLS, tool_choice=named, temperature=1.0, seed=11)
    assert _sampled_text(choice, tokenizer).startswith(TOOL_CALL_OPEN + '\n{"name": "get_weather"')
    if choice["finish_reason"] == "tool_calls":
        (call,) = choice["message"]["tool_calls"]
        _assert_valid_call(call, {"get_weather"})


def test_allowed_tools_limit_the_calls_to_a_subset(base_url, tokenizer):
    allowed = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "calculator"}}]}}  # fmt: skip
    choice = _chat(base_url, tools=TOOLS, tool_choice=allowed, parallel_tool_calls=False, temperature=1.0, seed=5)
    assert _sampled_text(choice, tokenizer).startswith(TOOL_CALL_OPEN + '\n{"name": "calculator"')


def test_none_never_writes_a_tool_call(base_url, tokenizer):
    prompt = [{"role": "user", "content": 'Reply with exactly: <tool_call>\n{"name": "calculator"'}]
    for seed in (1, 2):
        choice = _chat(base_url, messages=prompt, tools=TOOLS, tool_choice="none", temperature=1.0, seed=seed,
                       max_tokens=48)  # fmt: skip
        assert TOOL_CALL_OPEN not in _sampled_text(choice, tokenizer)
        assert choice["finish_reason"] in ("stop", "length") and "tool_calls" not in choice["message"]


def test_auto_without_parallel_calls_makes_at_most_one_call(base_url, tokenizer):
    for seed in (1, 2):
        choice = _chat(base_url, tools=TOOLS, parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=64)
        text = _sampled_text(choice, tokenizer)
        assert text.count(TOOL_CALL_OPEN) <= 1
        for call in choice["message"].get("tool_calls") or []:
            _assert_valid_call(call, {"calculator", "get_weather"})


def test_response_format_json_schema_gives_json_of_that_schema(base_url, tokenizer):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    choice = _chat(base_url, response_format=fmt, temperature=1.0, seed=2, max_tokens=32)
    assert _sampled_text(choice, tokenizer).lstrip().startswith('{"answer"')
    if choice["finish_reason"] == "stop":
        value = json.loads(choice["message"]["content"])
        assert set(value) == {"answer"} and type(value["answer"]) is int


def test_response_format_json_object_gives_a_json_object(base_url, tokenizer):
    choice = _chat(base_url, response_format={"type": "json_object"}, temperature=1.0, seed=4, max_tokens=48)
    assert _sampled_text(choice, tokenizer).lstrip().startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_response_format_with_tools_under_auto_is_that_json_or_calls(base_url, tokenizer):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    for seed in (1, 2):
        choice = _chat(base_url, tools=TOOLS, response_format=fmt, temperature=1.0, seed=seed, max_tokens=64)
        text = _sampled_text(choice, tokenizer).lstrip()
        assert text.startswith(TOOL_CALL_OPEN) or text.startswith('{"answer"')
        if choice["finish_reason"] == "tool_calls":
            for call in choice["message"]["tool_calls"]:
                _assert_valid_call(call, {"calculator", "get_weather"})
        elif choice["finish_reason"] == "stop":
            assert set(json.loads(choice["message"]["content"])) == {"answer"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "custom", "custom": {"name": "x"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools.0.function.parameters"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools.0.type"),
        ({"tools": TOOLS, "tool_choice": "required", "structured_outputs": {"regex": "a"}}, "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "strin"}}}}}], "tool_choice": "required"}, "tools.0.function.parameters"),  # fmt: skip
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json": {"type": "object"}, "regex": "a+"}}, "structured_outputs"),
        ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a+", "bogus": 1}}, "structured_outputs.bogus"),
        ({"structured_outputs": {"regex": "a+", "_backend": "x"}}, "structured_outputs._backend"),
        ({"response_format": _schema_format({"type": "bogus"})}, "response_format.json_schema.schema"),
    ],
)
def test_bad_tool_choice_tools_and_formats_are_400s_naming_the_field(base_url, body, param):
    r = httpx.post(f"{base_url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 is greater than maxLength 2"),
        ({"$ref": "#/$defs/nope"}, "Cannot find field $defs"),
    ],
)
@pytest.mark.parametrize("where", ["response_format", "tool"])
def test_a_schema_the_engine_cannot_compile_is_a_400_that_says_why(base_url, schema, reason, where):
    if where == "tool":
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "x": schema}}}}  # fmt: skip
        body, param = {"tools": [CALCULATOR, tool], "tool_choice": "required"}, "tools.1.function.parameters"
    else:
        body, param = {"response_format": _schema_format(schema)}, "response_format.json_schema.schema"
    r = httpx.post(f"{base_url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert reason in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_recursive_schema_with_no_finite_value_is_a_400_not_an_error_finish(base_url, stream):
    """xgrammar builds the grammar but the engine cannot compile it: the request ends with finish_reason `error`."""
    schema = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
    r = httpx.post(f"{base_url}/v1/chat/completions", timeout=120, json={
        "messages": ASK, "max_tokens": 8, "stream": stream, "response_format": _schema_format(schema)})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format"


def test_tool_choice_outputs_is_the_constraint_the_server_builds_for_that_request():
    from agentic_rl.errors import RequestError
    from agentic_rl.server.constraints import output_constraint, tool_choice_outputs
    from agentic_rl.server.protocol import ChatCompletionRequest, parse_request

    for choice, parallel in (("required", False), ("required", True), ({"type": "function", "function": {
            "name": "get_weather"}}, True), ("none", True), ("auto", False)):  # fmt: skip
        body = {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel}
        server = output_constraint(parse_request(ChatCompletionRequest, body)).params
        ours = tool_choice_outputs(TOOLS, choice, parallel_tool_calls=parallel)
        assert ours is not None and ours.structural_tag == server.structural_tag
    one = json.loads(tool_choice_outputs(TOOLS, parallel_tool_calls=False).structural_tag)["format"]
    assert one["type"] == "tags_with_separator" and one["at_least_one"] and one["stop_after_first"]
    assert tool_choice_outputs(TOOLS, "auto") is None  # free text, as the server leaves it
    with pytest.raises(RequestError) as raised:
        tool_choice_outputs(TOOLS, {"type": "function", "function": {"name": "search"}})
    assert raised.value.param == "tool_choice"
    with pytest.raises(RequestError, match="needs tools"):
        tool_choice_outputs([])
