"""Llama 3.x tool calls (`LLAMA3_JSON`): the whole message as `{"name", "parameters"}` objects, or after
`<|python_tag|>`; JSON final answers that are not calls; calls written and read back (pure functions)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.parser import (
    HERMES,
    LLAMA3_JSON,
    PYTHON_TAG,
    ToolCall,
    ToolCallError,
    action_text,
    find_tool_calls,
    format_tool_call,
    format_tool_calls,
    parse_tool_calls,
)

CALC = '{"name": "calculator", "parameters": {"expression": "2 + 3"}}'
WEATHER = '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'


def calls(text: str) -> list[tuple[str, object]]:
    return [(c.name, c.arguments) for c in parse_tool_calls(text, call_format=LLAMA3_JSON) if isinstance(c, ToolCall)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CALC, [("calculator", {"expression": "2 + 3"})]),
        ("  \n" + CALC + "\n", [("calculator", {"expression": "2 + 3"})]),
        (PYTHON_TAG + CALC, [("calculator", {"expression": "2 + 3"})]),
        (PYTHON_TAG + " " + CALC, [("calculator", {"expression": "2 + 3"})]),
        (CALC + "; " + WEATHER, [("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})]),
        (CALC + ";" + WEATHER, [("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})]),
        (CALC + "\n" + WEATHER, [("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})]),
        (CALC + " ;\n " + WEATHER + ";", [("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})]),
        (PYTHON_TAG + CALC + "; " + WEATHER, [("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})]),
        ('{"name": "now", "arguments": {}}', [("now", {})]),  # "arguments" as an alias
        ('{"name": "now", "parameters": null}', [("now", {})]),
        ("<think>\nI should compute.\n</think>\n\n" + CALC, [("calculator", {"expression": "2 + 3"})]),
        ("I should compute.\n</think>\n" + CALC, [("calculator", {"expression": "2 + 3"})]),  # prompt-opened reasoning
        ("Let me compute.\n" + PYTHON_TAG + CALC, [("calculator", {"expression": "2 + 3"})]),  # text before the tag
        ('{"name": "echo", "parameters": {"text": "<tool_call> [TOOL_CALLS] }"}}', [("echo", {"text": "<tool_call> [TOOL_CALLS] }"})]),
    ],
)  # fmt: skip
def test_llama3_calls_are_read(text, expected):
    assert calls(text) == expected
    start, found = find_tool_calls(text, call_format=LLAMA3_JSON)
    assert start >= 0 and len(found) == len(expected)


@pytest.mark.parametrize(
    "text",
    [
        '{"answer": 5}',
        '{"name": "Bob", "age": 3}',  # a "name" but no "parameters": an answer about a person
        '{"name": 3, "parameters": {}}',
        '[{"name": "calculator", "parameters": {}}]',
        "The call would be " + CALC,  # text before the JSON
        CALC + " and then I am done.",  # text after the JSON
        CALC + '; {"answer": 5}',  # one object of several is not a call
        '{"name": "calculator", "parameters": {"expression": "2 + 3"}',  # does not decode: an answer without the tag
        "<think>\n" + CALC + "\n</think>\nThe answer is 5.",  # a sketch inside reasoning
        "<think>\n" + CALC,  # reasoning cut off
        "5",
        "",
    ],
)
def test_json_that_is_not_a_whole_message_of_calls_is_a_final_answer(text):
    assert parse_tool_calls(text, call_format=LLAMA3_JSON) == []
    assert action_text(text, LLAMA3_JSON) == ""


def test_bare_json_is_read_only_under_the_llama3_format():
    assert parse_tool_calls(CALC) == [] and parse_tool_calls(CALC, call_format=HERMES) == []
    assert parse_tool_calls(PYTHON_TAG + CALC) == []  # the tag is Llama 3's own
    (call,) = parse_tool_calls(CALC, call_format=LLAMA3_JSON)
    assert call == ToolCall("calculator", {"expression": "2 + 3"}, CALC)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (PYTHON_TAG, "empty tool call"),
        (PYTHON_TAG + "   ", "empty tool call"),
        (PYTHON_TAG + '{"name": "calculator", "parameters": {"expression": "2', "invalid JSON"),
        (PYTHON_TAG + 'brave_search.call(query="oslo")', "must be a JSON object"),
        (PYTHON_TAG + '{"parameters": {}}', 'needs a "name"'),
        (PYTHON_TAG + "[1, 2]", "must be a JSON object"),
    ],
)
def test_after_the_python_tag_anything_malformed_is_an_error(text, message):
    (error,) = parse_tool_calls(text, call_format=LLAMA3_JSON)
    assert isinstance(error, ToolCallError) and message in error.message


def test_after_the_python_tag_calls_are_kept_and_a_bad_one_is_an_error():
    text = PYTHON_TAG + CALC + '; {"name": "x", "parameters": {"a": tru}'
    good, bad = parse_tool_calls(text, call_format=LLAMA3_JSON)
    assert isinstance(good, ToolCall) and isinstance(bad, ToolCallError)


def test_the_action_starts_at_the_call():
    assert action_text("<think>\nhm\n</think>\n\n" + CALC, LLAMA3_JSON) == CALC
    assert action_text("Calling.\n" + PYTHON_TAG + CALC, LLAMA3_JSON) == PYTHON_TAG + CALC
    assert action_text(CALC) == ""


def test_tool_call_blocks_are_still_read_under_the_llama3_format():
    text = 'Let me check.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}\n</tool_call>'
    assert calls(text) == [("calculator", {"expression": "1"})]


def test_written_calls_are_what_the_template_writes():
    assert format_tool_call("calculator", {"expression": "2 + 3"}, LLAMA3_JSON) == CALC
    two = format_tool_calls([("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})],
                            LLAMA3_JSON)  # fmt: skip
    assert two == CALC + "; " + WEATHER
    assert calls(two) == [("calculator", {"expression": "2 + 3"}), ("get_weather", {"city": "Oslo", "days": 3})]


def test_a_written_call_matches_the_llama_template_render():
    from pathlib import Path

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = (Path(__file__).parent / "fixtures" / "templates" / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    rendered = env.from_string(source).render(messages=messages, bos_token="", add_generation_prompt=False,
                                              raise_exception=lambda m: (_ for _ in ()).throw(ValueError(m)))  # fmt: skip
    assert "<|end_header_id|>\n\n" + format_tool_call("calculator", {"expression": "2 + 3"}, LLAMA3_JSON) + "<|eot_id|>" in rendered


_NAMES = st.text(min_size=1).filter(lambda s: s.strip() == s)
_ARGUMENTS = st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8) | st.booleans() | st.none(), max_size=4)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(_NAMES, _ARGUMENTS), min_size=1, max_size=3), st.booleans())
def test_written_calls_read_back_as_the_same_calls(written, tagged):
    text = format_tool_calls(written, LLAMA3_JSON)
    text = PYTHON_TAG + text if tagged else text
    found = parse_tool_calls(text, call_format=LLAMA3_JSON)
    assert [(c.name, c.arguments) for c in found] == written


_FRAGMENTS = [PYTHON_TAG, CALC, "{", "}", ";", '"name"', '"parameters"', ":", ", ", "\n", " ", "<think>", "</think>",
              "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[", "]", '"', "null", "1"]  # fmt: skip


@settings(deadline=None, max_examples=400)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join))
def test_reading_any_text_in_the_llama3_format_never_raises(text):
    start, found = find_tool_calls(text, call_format=LLAMA3_JSON)
    assert (start >= 0) == bool(found)
    for call in found:
        assert isinstance(call, (ToolCall, ToolCallError))
        if isinstance(call, ToolCall):
            assert call.name.strip() == call.name != ""
    assert action_text(text, LLAMA3_JSON) == (text[start:] if start >= 0 else "")
