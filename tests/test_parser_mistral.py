"""Mistral tool calls (`MISTRAL`): `[TOOL_CALLS]` and a JSON array of calls with 9-character ids (and the newer
`[TOOL_CALLS]name[ARGS]{...}` form); ids kept, written and derived (pure functions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.parser import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    QWEN3_CODER,
    ToolCall,
    ToolCallError,
    action_text,
    find_tool_calls,
    format_tool_call,
    format_tool_calls,
    is_mistral_call_id,
    mistral_call_id,
    parse_tool_calls,
)

TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja"
ONE = '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2 + 3"}, "id": "abcDEF123"}]'
TWO = ('[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2 + 3"}, "id": "abcDEF123"}, '
       '{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "XYZxyz789"}]')  # fmt: skip


def read(text: str, call_format: str | None = MISTRAL) -> list[tuple[str, object, str]]:
    return [(c.name, c.arguments, c.id) for c in parse_tool_calls(text, call_format=call_format) if isinstance(c, ToolCall)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ONE, [("calculator", {"expression": "2 + 3"}, "abcDEF123")]),
        (TWO, [("calculator", {"expression": "2 + 3"}, "abcDEF123"), ("get_weather", {"city": "Oslo"}, "XYZxyz789")]),
        ("Let me compute. " + ONE, [("calculator", {"expression": "2 + 3"}, "abcDEF123")]),
        ('[TOOL_CALLS] {"name": "now", "arguments": {}}', [("now", {}, "")]),  # one object, no id
        ('[TOOL_CALLS][{"name": "now", "arguments": "{\\"a\\": 1}", "id": "x"}]', [("now", {"a": 1}, "x")]),
        ('[TOOL_CALLS]calculator[ARGS]{"expression": "2 + 3"}', [("calculator", {"expression": "2 + 3"}, "")]),
        ('[TOOL_CALLS]calculator[CALL_ID]abcDEF123[ARGS]{"expression": "1"}', [("calculator", {"expression": "1"}, "abcDEF123")]),
        ('[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{"y": 2}', [("a", {"x": 1}, ""), ("b", {"y": 2}, "")]),
        ("<think>\nhm\n</think>\n" + ONE, [("calculator", {"expression": "2 + 3"}, "abcDEF123")]),
        ('[TOOL_CALLS][{"name": "echo", "arguments": {"t": "] [TOOL_CALLS] <tool_call>"}, "id": "abcDEF123"}]',
         [("echo", {"t": "] [TOOL_CALLS] <tool_call>"}, "abcDEF123")]),
    ],
)  # fmt: skip
def test_mistral_calls_are_read_with_their_ids(text, expected):
    assert read(text) == expected


@pytest.mark.parametrize("call_format", [None, HERMES, QWEN3_CODER, LLAMA3_JSON])
def test_tool_calls_token_is_read_whatever_the_template(call_format):
    assert read(ONE, call_format) == [("calculator", {"expression": "2 + 3"}, "abcDEF123")]


def test_a_call_inside_reasoning_is_not_a_call():
    assert parse_tool_calls("<think>\n" + ONE + "\n</think>\nIt is 5.", call_format=MISTRAL) == []
    assert parse_tool_calls("<think>\n" + ONE, call_format=MISTRAL) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[TOOL_CALLS]", "empty tool call"),
        ("[TOOL_CALLS][]", "empty array"),
        ('[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2', "invalid JSON"),
        ("[TOOL_CALLS] just some words", "JSON array of calls"),
        ('[TOOL_CALLS][ARGS]{"x": 1}', "needs a name"),
        ('[TOOL_CALLS]calc[ARGS]{"x": ', "invalid JSON in the arguments"),
        ('[TOOL_CALLS][{"arguments": {}}]', 'needs a "name"'),
        ("[TOOL_CALLS][1]", "must be a JSON object"),
    ],
)
def test_malformed_calls_are_errors_for_the_model(text, message):
    (error,) = parse_tool_calls(text, call_format=MISTRAL)
    assert isinstance(error, ToolCallError) and message in error.message


def test_the_action_starts_at_the_marker():
    assert action_text("Sure. " + ONE, MISTRAL) == ONE
    start, _ = find_tool_calls("Sure. " + ONE)
    assert start == len("Sure. ")


def test_written_calls_are_what_the_template_writes():
    assert format_tool_call("calculator", {"expression": "2 + 3"}, MISTRAL, call_id="abcDEF123") == ONE
    written = format_tool_calls([("calculator", {"expression": "2 + 3"}, "abcDEF123"),
                                 ("get_weather", {"city": "Oslo"}, "XYZxyz789")], MISTRAL)  # fmt: skip
    assert written == TWO


def test_a_written_call_matches_the_mistral_template_render():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    calls = [{"type": "function", "id": "abcDEF123", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}},
             {"type": "function", "id": "XYZxyz789", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}]
    rendered = env.from_string(TEMPLATE.read_text()).render(messages=messages, bos_token="<s>", eos_token="</s>",
                                                           raise_exception=lambda m: (_ for _ in ()).throw(ValueError(m)))  # fmt: skip
    assert rendered.endswith("[/INST]" + TWO + "</s>")


def test_ids_are_nine_alphanumerics_derived_deterministically():
    ids = {mistral_call_id(seed) for seed in range(500)}
    assert len(ids) == 500 and all(is_mistral_call_id(i) for i in ids)
    assert mistral_call_id("call_abc") == mistral_call_id("call_abc") != mistral_call_id("call_abd")
    assert not is_mistral_call_id("abc") and not is_mistral_call_id("abcDEF12!") and not is_mistral_call_id(None)
    given = format_tool_call("f", {}, MISTRAL, call_id="call_0123456789")  # not Mistral's shape: derived from it
    (call,) = parse_tool_calls(given, call_format=MISTRAL)
    assert call.id == mistral_call_id("call_0123456789")
    (a,) = parse_tool_calls(format_tool_call("f", {"x": 1}, MISTRAL), call_format=MISTRAL)
    (b,) = parse_tool_calls(format_tool_call("f", {"x": 1}, MISTRAL), call_format=MISTRAL)
    assert a.id == b.id and is_mistral_call_id(a.id)
    first, second = parse_tool_calls(format_tool_calls([("f", {}), ("f", {})], MISTRAL), call_format=MISTRAL)
    assert first.id != second.id  # two same calls in one turn get different ids


_NAMES = st.text(min_size=1).filter(lambda s: s.strip() == s)
_ARGUMENTS = st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8) | st.booleans() | st.none(), max_size=4)
_IDS = st.none() | st.from_regex(r"[0-9A-Za-z]{9}", fullmatch=True) | st.text(max_size=12)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(_NAMES, _ARGUMENTS, _IDS), min_size=1, max_size=3), st.sampled_from([None, MISTRAL]))
def test_written_calls_read_back_as_the_same_calls_and_ids(written, call_format):
    found = parse_tool_calls("Calling. " + format_tool_calls(written, MISTRAL), call_format=call_format)
    assert [(c.name, c.arguments) for c in found] == [(n, a) for n, a, _ in written]
    for call, (_, _, call_id) in zip(found, written, strict=True):
        assert is_mistral_call_id(call.id)
        assert call.id == call_id or not is_mistral_call_id(call_id)


_FRAGMENTS = ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", ONE, "[", "]", "{", "}", '"name"', '"arguments"', '"id"', ":",
              ", ", "\n", " ", "<think>", "</think>", "<tool_call>", '"', "null", "f"]  # fmt: skip


@settings(deadline=None, max_examples=400)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join))
def test_reading_any_text_with_mistral_markers_never_raises(text):
    start, found = find_tool_calls(text, call_format=MISTRAL)
    assert (start >= 0) == bool(found)
    for call in found:
        assert isinstance(call, (ToolCall, ToolCallError))
    assert action_text(text, MISTRAL) == (text[start:] if start >= 0 else "")
