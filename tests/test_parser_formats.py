"""Unit tables of agentic_rl.parser beyond the Hermes JSON block: the Qwen3-Coder XML form, calls inside reasoning,
arguments that are not a JSON object, and the tool-call format a chat template teaches (pure functions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.parser import (
    HERMES,
    QWEN3_CODER,
    ToolCall,
    ToolCallError,
    action_text,
    find_tool_calls,
    format_tool_call,
    parse_tool_calls,
    split_thought,
    tool_call_format,
)

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
SCHEMA = {"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"},
    "o": {"type": "object"}, "a": {"type": "array"}, "z": {"type": "null"}, "opt": {"type": ["integer", "null"]},
    "u": {"type": ["string", "integer"]}, "free": {},
}}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]


def xml(name: str, *params: tuple[str, str], close: bool = True) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}" + ("</function>\n</tool_call>" if close else "")


def hermes(name: str, arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# --------------------------------------------------------------------------------------------------- XML form


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (xml("calculator", ("expression", "2 + 3")), [("calculator", {"expression": "2 + 3"})]),
        ("Let me compute.\n" + xml("calculator", ("expression", "2 + 3")), [("calculator", {"expression": "2 + 3"})]),
        (xml("now"), [("now", {})]),
        (xml("w", ("city", "Oslo"), ("unit", "C")), [("w", {"city": "Oslo", "unit": "C"})]),
        (xml("code", ("text", "line 1\n  line 2\n")), [("code", {"text": "line 1\n  line 2\n"})]),
        (xml("code", ("text", '{"a": [1, 2]} } </tool_call')), [("code", {"text": '{"a": [1, 2]} } </tool_call'})]),
        (xml(" spaced ", (" key ", "v")), [("spaced", {"key": "v"})]),
        (xml("a", ("x", "1")) + "\n" + xml("b", ("y", "2")), [("a", {"x": "1"}), ("b", {"y": "2"})]),
        ("<tool_call>\n<function=a>\n</function>\n<function=b>\n</function>\n</tool_call>", [("a", {}), ("b", {})]),
        ("<tool_call><function=a><parameter=x>1</parameter></function></tool_call>", [("a", {"x": "1"})]),
        (xml("a", ("x", "1"), close=False), [("a", {"x": "1"})]),  # cut by a stop string
        ("<tool_call>\n<function=a>\n<parameter=x>\n1", [("a", {"x": "1"})]),  # cut inside a value
        ("<tool_call>\n<function=a>\n<parameter=x>\n1\n<parameter=y>\n2\n</function>", [("a", {"x": "1", "y": "2"})]),
        (xml("a", ("x", "1"), close=False) + xml("b"), [("a", {"x": "1"}), ("b", {})]),
        (hermes("j", {"k": 1}) + xml("x", ("k", "1")), [("j", {"k": 1}), ("x", {"k": "1"})]),  # both forms read
    ],
)
def test_xml_form_reads_each_function_block_as_a_call(text, expected):
    calls = parse_tool_calls(text)
    assert all(isinstance(c, ToolCall) and not c.arguments_error for c in calls), calls
    assert [(c.name, c.arguments) for c in calls] == expected


def test_xml_call_keeps_its_function_block_as_raw():
    text = "Sure.\n" + xml("calculator", ("expression", "2 + 3"))
    (call,) = parse_tool_calls(text)
    assert call.raw == "<function=calculator>\n<parameter=expression>\n2 + 3\n</parameter>\n</function>"
    assert find_tool_calls(text)[0] == len("Sure.\n")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("s", "42", "42"), ("s", "true", "true"), ("s", "null", "null"), ("s", " padded ", " padded "),
        ("i", "42", 42), ("i", " -7 ", -7), ("i", "4.5", "4.5"), ("i", "forty", "forty"), ("i", "9" * 5000, "9" * 5000),
        ("n", "2.5", 2.5), ("n", "3", 3), ("n", "-1e3", -1000.0), ("n", "1e999", "1e999"), ("n", "nan", "nan"),
        ("b", "true", True), ("b", "False", False), ("b", "yes", "yes"),
        ("o", '{"k": [1, 2]}', {"k": [1, 2]}), ("o", "[1]", "[1]"), ("o", "{bad", "{bad"),
        ("o", "[" * 100 + "]" * 100, "[" * 100 + "]" * 100),
        ("a", "[1, \"x\"]", [1, "x"]), ("a", '{"k": 1}', '{"k": 1}'),
        ("z", "null", None), ("i", "null", None), ("opt", "5", 5), ("opt", "null", None),
        ("u", "5", "5"), ("free", "5", "5"), ("unknown", "5", "5"),
    ],
)  # fmt: skip
def test_xml_values_take_the_type_their_schema_names_when_they_read_as_it(key, value, expected):
    (call,) = parse_tool_calls(xml("f", (key, value)), TOOLS)
    assert call.arguments == {key: expected}
    assert type(call.arguments[key]) is type(expected)


def test_xml_values_stay_strings_without_schemas_or_for_another_tool():
    assert parse_tool_calls(xml("f", ("i", "42")))[0].arguments == {"i": "42"}
    assert parse_tool_calls(xml("g", ("i", "42")), TOOLS)[0].arguments == {"i": "42"}
    bare = [{"name": "f", "parameters": SCHEMA}]  # a bare function schema is read too
    assert parse_tool_calls(xml("f", ("i", "42")), bare)[0].arguments == {"i": 42}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "needs a function name"),
        ("<tool_call>\n<function=a\n<parameter=x>1</parameter></function></tool_call>", "needs a function name"),
        ("<tool_call>\n<function=a>\n<parameter=>1</parameter></function></tool_call>", "a parameter of 'a' needs a name"),
        (xml("a", ("x", "1"), ("x", "2")), "parameter 'x' of 'a' is given twice"),
        ("<tool_call>\n<function=a>\nstray text\n</function>\n</tool_call>", "unexpected text in the function block"),
        ("<tool_call>\n<function=a>\n</function>\ntrailing</tool_call>", "unexpected text after the function block"),
    ],
)
def test_xml_form_written_wrongly_is_an_error_for_the_model(text, message):
    calls = parse_tool_calls(text + "\n" + xml("ok"))
    assert isinstance(calls[0], ToolCallError) and message in calls[0].message, calls
    assert isinstance(calls[-1], ToolCall) and calls[-1].name == "ok"  # the next block is read


# --------------------------------------------------------------------------------------------------- reasoning


CALL = hermes("calculator", {"expression": "1 + 1"})


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (f"<think>I could write {CALL} here.</think>\nThe answer is 2.", []),
        (f"<think>maybe {xml('calculator')}</think>\nNo call needed.", []),
        (f"<think>sketch {CALL} then", []),  # a turn cut inside reasoning
        (f"<think>sketch {CALL}</think>\n{hermes('real', {})}", ["real"]),
        (f"I could write {CALL} here.</think>\n{hermes('real', {})}", ["real"]),  # reasoning the prompt opened
        (f"first {CALL}\n</think>\nNothing to do.", []),
        (f"{hermes('a', {})}<think>then {CALL}</think>{hermes('b', {})}", ["a", "b"]),
        (f"<think>one</think>{hermes('a', {})}</think>{hermes('b', {})}", ["a", "b"]),  # only a leading close counts
        (hermes("echo", {"text": "<think> is a tag"}) + hermes("b", {}), ["echo", "b"]),  # tags inside JSON strings
        (hermes("echo", {"text": "</think>"}) + hermes("b", {}), ["echo", "b"]),
        (xml("echo", ("text", "<think>")) + xml("b"), ["echo", "b"]),
    ],
)
def test_calls_inside_reasoning_are_not_calls(text, names):
    assert [c.name for c in parse_tool_calls(text)] == names


def test_where_calls_begin_and_the_action_skip_reasoning():
    text = f"<think>try {CALL}</think>\nSo: {CALL}"
    start, calls = find_tool_calls(text)
    assert start == text.rindex("<tool_call>") and len(calls) == 1
    assert action_text(text) == CALL
    assert action_text(f"<think>try {CALL}</think>\nThe answer is 2.") == ""
    assert action_text(f"<think>try {CALL}") == ""
    assert find_tool_calls("no call") == (-1, [])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("reasoning the prompt opened\n</think>\n\nThe answer is 4.", ("reasoning the prompt opened", "The answer is 4.")),
        ("</think>answer", ("", "answer")),
        ("<think>a</think>b</think>c", ("a", "b</think>c")),
        ("<think>cut off", ("cut off", "")),
    ],
)
def test_split_thought_reads_reasoning_the_prompt_opened(text, expected):
    assert split_thought(text) == expected


# --------------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("arguments", "kept", "error"),
    [
        ("weather in Oslo", "weather in Oslo", "is a string that is not valid JSON"),
        ('{"city": "Oslo"}', {"city": "Oslo"}, ""),
        ("", {}, ""),
        ("null", {}, ""),
        (None, {}, ""),
        ('"Oslo"', '"Oslo"', "must be a JSON object, got str"),
        ("[1, 2]", "[1, 2]", "must be a JSON object, got list"),
        ("7", "7", "must be a JSON object, got int"),
        (["Oslo"], ["Oslo"], "must be a JSON object, got list"),
        (7, 7, "must be a JSON object, got int"),
        (1.5, 1.5, "must be a JSON object, got float"),
        (False, False, "must be a JSON object, got bool"),
    ],
)
def test_a_call_is_kept_whatever_its_arguments_and_says_when_they_are_not_an_object(arguments, kept, error):
    (call,) = parse_tool_calls(hermes("weather", arguments))
    assert isinstance(call, ToolCall) and call.name == "weather"
    assert call.arguments == kept and type(call.arguments) is type(kept)
    assert (error in call.arguments_error) if error else call.arguments_error == ""
    assert not error or "'weather'" in call.arguments_error


def test_a_call_without_arguments_has_none():
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == [ToolCall("now", {}, '{"name": "now"}')]


# --------------------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.jinja")), ids=lambda p: p.name)
def test_the_format_is_chosen_from_the_chat_template(path):
    expected = {"qwen3-coder-style.jinja": QWEN3_CODER, "qwen3.5-style.jinja": QWEN3_CODER,
                "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3_json",
                "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3_json",
                "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral"}.get(path.name, HERMES)  # fmt: skip
    assert tool_call_format(path.read_text()) == expected


def test_the_format_of_no_template_or_named_templates():
    assert tool_call_format(None) == HERMES
    assert tool_call_format({"default": "{{ '<tool_call>\\n<function=' + name }}"}) == QWEN3_CODER


def test_format_tool_call_writes_each_format():
    assert format_tool_call("calc", {"expression": "2 + 3"}) == (
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    )
    assert format_tool_call("calc", {"expression": "2 + 3", "n": 2}, QWEN3_CODER) == (
        "<tool_call>\n<function=calc>\n<parameter=expression>\n2 + 3\n</parameter>\n"
        "<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    assert format_tool_call("é", {"k": "é"}, ensure_ascii=True) == (
        '<tool_call>\n{"name": "\\u00e9", "arguments": {"k": "\\u00e9"}}\n</tool_call>'
    )


_VALUES = {
    "s": st.text().filter(lambda s: not any(t in s for t in ("</parameter>", "<parameter=", "</function>", "</tool_call>"))),
    "i": st.integers(), "n": st.floats(allow_nan=False, allow_infinity=False), "b": st.booleans(),
    "o": st.dictionaries(st.text(), st.integers() | st.text(), max_size=3), "a": st.lists(st.integers(), max_size=3),
}  # fmt: skip


@settings(deadline=None, max_examples=200)
@given(st.fixed_dictionaries({}, optional=_VALUES), st.sampled_from([HERMES, QWEN3_CODER]))
def test_a_written_call_reads_back_as_the_same_call(arguments, call_format):
    text = format_tool_call("f", arguments, call_format)
    (call,) = parse_tool_calls("Calling.\n" + text, TOOLS)
    assert isinstance(call, ToolCall) and call.name == "f" and call.arguments == arguments


_FRAGMENTS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "<think>",
              "</think>", ">", "<", "\n", " ", "f", "i", "{", "}", '"', "1", "null", "true", '{"name": "f"}']  # fmt: skip


@settings(deadline=None, max_examples=400)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=4), max_size=40).map("".join))
def test_any_mix_of_both_forms_and_reasoning_never_raises(text):
    start, calls = find_tool_calls(text, TOOLS)
    assert (start >= 0) == bool(calls)
    assert start < 0 or text.startswith("<tool_call>", start)
    for call in calls:
        if isinstance(call, ToolCall):
            assert call.name.strip() == call.name != "" and "\n" not in call.raw[:1]
            assert isinstance(call.arguments, dict) != bool(call.arguments_error)
        else:
            assert isinstance(call, ToolCallError) and call.message
    thought, rest = split_thought(text)
    assert isinstance(thought, str) and isinstance(rest, str)
    assert action_text(text) == (text[start:] if start >= 0 else "")
