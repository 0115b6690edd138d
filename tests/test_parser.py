"""Unit tests of agentic_rl.parser: `<tool_call>` parsing and `<think>` splitting (pure functions, no engine)."""

from __future__ import annotations

import json
import sys

import pytest

from agentic_rl.parser import (
    MAX_JSON_DEPTH,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    ToolCallError,
    json_nesting_exceeds,
    parse_tool_calls,
    split_thought,
)


def call_text(obj, *, close: bool = True, sep: str = "\n") -> str:
    body = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{sep}{body}{sep}{TOOL_CALL_CLOSE if close else ''}"


# --------------------------------------------------------------------------------------------------- well-formed


def test_parser_tags_are_the_hermes_tags():
    assert TOOL_CALL_OPEN == "<tool_call>"
    assert TOOL_CALL_CLOSE == "</tool_call>"


def test_parser_reads_a_single_call_with_name_and_arguments():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    calls = parse_tool_calls(text)
    assert calls == [
        ToolCall(
            name="calculator",
            arguments={"expression": "2 + 3"},
            raw='{"name": "calculator", "arguments": {"expression": "2 + 3"}}',
        )
    ]


def test_parser_reads_a_call_without_whitespace_around_the_json():
    calls = parse_tool_calls('<tool_call>{"name":"calc","arguments":{"x":1}}</tool_call>')
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCall)
    assert calls[0].name == "calc"
    assert calls[0].arguments == {"x": 1}
    assert calls[0].raw == '{"name":"calc","arguments":{"x":1}}'


def test_parser_returns_several_calls_in_text_order():
    text = (
        "first "
        + call_text({"name": "a", "arguments": {"i": 1}})
        + " then "
        + call_text({"name": "b", "arguments": {"i": 2}})
        + "\n"
        + call_text({"name": "c", "arguments": {"i": 3}})
        + " done"
    )
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCall, ToolCall, ToolCall]
    assert [c.name for c in calls] == ["a", "b", "c"]
    assert [c.arguments["i"] for c in calls] == [1, 2, 3]


def test_parser_accepts_closing_brace_inside_string_argument():
    calls = parse_tool_calls(call_text({"name": "echo", "arguments": {"text": "a } b }} c {"}}))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == {"text": "a } b }} c {"}


def test_parser_accepts_closing_tag_inside_string_argument():
    args = {"text": "literal </tool_call> and <tool_call> inside"}
    text = call_text({"name": "echo", "arguments": args}) + "\n" + call_text({"name": "second", "arguments": {}})
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCall, ToolCall]
    assert calls[0].name == "echo"
    assert calls[0].arguments == args
    assert calls[1].name == "second"


def test_parser_accepts_balanced_json_without_closing_tag_at_end_of_text():
    calls = parse_tool_calls('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n  ')
    assert calls == [
        ToolCall(
            name="calculator",
            arguments={"expression": "1+1"},
            raw='{"name": "calculator", "arguments": {"expression": "1+1"}}',
        )
    ]


def test_parser_accepts_missing_closing_tag_followed_directly_by_next_call():
    text = '<tool_call>{"name": "a", "arguments": {"n": 1}}<tool_call>{"name": "b", "arguments": {"n": 2}}</tool_call>'
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCall, ToolCall]
    assert [(c.name, c.arguments) for c in calls] == [("a", {"n": 1}), ("b", {"n": 2})]


def test_parser_accepts_missing_closing_tag_followed_by_whitespace_then_next_call():
    text = '<tool_call>{"name": "a"}\n\n<tool_call>{"name": "b"}\n</tool_call>'
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["a", "b"]
    assert all(isinstance(c, ToolCall) for c in calls)


def test_parser_decodes_arguments_given_as_json_encoded_string():
    obj = {"name": "calculator", "arguments": json.dumps({"expression": "6 * 7"})}
    calls = parse_tool_calls(call_text(obj))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == {"expression": "6 * 7"}


def test_parser_treats_empty_arguments_string_as_no_arguments():
    calls = parse_tool_calls(call_text({"name": "noop", "arguments": "   "}))
    assert calls[0] == ToolCall(name="noop", arguments={}, raw=calls[0].raw)


def test_parser_keeps_a_call_whose_arguments_string_is_not_valid_json_and_says_why():
    calls = parse_tool_calls(call_text({"name": "calculator", "arguments": "{expression: 1+1"}))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCall)
    assert calls[0].name == "calculator" and calls[0].arguments == "{expression: 1+1"
    assert "not valid JSON" in calls[0].arguments_error
    assert "'calculator'" in calls[0].arguments_error


def test_parser_keeps_a_call_whose_arguments_string_decodes_to_a_non_object_and_says_why():
    calls = parse_tool_calls(call_text({"name": "f", "arguments": "[1, 2]"}))
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == "[1, 2]"  # as written, as vLLM keeps it
    assert "must be a JSON object, got list" in calls[0].arguments_error


def test_parser_accepts_parameters_as_alias_of_arguments():
    calls = parse_tool_calls(call_text({"name": "calculator", "parameters": {"expression": "3-1"}}))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == {"expression": "3-1"}


def test_parser_prefers_arguments_over_parameters_when_both_given():
    calls = parse_tool_calls(call_text({"name": "f", "arguments": {"a": 1}, "parameters": {"p": 2}}))
    assert calls[0].arguments == {"a": 1}


def test_parser_gives_empty_arguments_when_none_given():
    calls = parse_tool_calls(call_text({"name": "now"}))
    assert calls == [ToolCall(name="now", arguments={}, raw='{"name": "now"}')]


def test_parser_gives_empty_arguments_when_arguments_is_null():
    calls = parse_tool_calls(call_text({"name": "now", "arguments": None}))
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == {}


def test_parser_strips_whitespace_around_the_name():
    calls = parse_tool_calls(call_text({"name": "  calculator \n", "arguments": {}}))
    assert isinstance(calls[0], ToolCall)
    assert calls[0].name == "calculator"


def test_parser_keeps_nested_objects_in_arguments():
    args = {"outer": {"inner": {"deep": [1, {"x": None, "y": True}], "s": "{}"}}, "n": 1.5}
    calls = parse_tool_calls(call_text({"name": "nest", "arguments": args}))
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == args


def test_parser_keeps_unicode_in_name_and_arguments():
    args = {"texte": "café ☕ 数学 \U0001f600", "escaped": "é"}
    text = "réponse: " + call_text({"name": "outil_é", "arguments": args})
    calls = parse_tool_calls(text)
    assert isinstance(calls[0], ToolCall)
    assert calls[0].name == "outil_é"
    assert calls[0].arguments == {"texte": "café ☕ 数学 \U0001f600", "escaped": "é"}


def test_parser_decodes_json_unicode_escapes():
    calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"s": "\\u00e9\\ud83d\\ude00"}}</tool_call>')
    assert calls[0].arguments == {"s": "é\U0001f600"}


# --------------------------------------------------------------------------------------------------- no call


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The answer is 42.",
        "I would call <tool_call but no tag",
        "a stray </tool_call> closing tag",
        '{"name": "calculator", "arguments": {}}',
    ],
)
def test_parser_returns_empty_list_when_there_is_no_call(text):
    assert parse_tool_calls(text) == []


# --------------------------------------------------------------------------------------------------- malformed


def test_parser_reports_missing_name():
    calls = parse_tool_calls(call_text({"arguments": {"x": 1}}))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCallError)
    assert '"name"' in calls[0].message
    assert calls[0].raw == '{"arguments": {"x": 1}}'


@pytest.mark.parametrize("name", ["", "   ", 7, None, ["calc"]])
def test_parser_reports_empty_or_non_string_name(name):
    calls = parse_tool_calls(call_text({"name": name, "arguments": {}}))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCallError)
    assert '"name"' in calls[0].message


@pytest.mark.parametrize(
    ("arguments", "type_name"),
    [([1, 2], "list"), (3, "int"), (2.5, "float"), (True, "bool")],
)
def test_parser_keeps_a_call_whose_arguments_are_not_an_object_and_says_why(arguments, type_name):
    calls = parse_tool_calls(call_text({"name": "calculator", "arguments": arguments}))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCall)
    assert calls[0].arguments == arguments
    assert f"must be a JSON object, got {type_name}" in calls[0].arguments_error


@pytest.mark.parametrize(("body", "type_name"), [("42", "int"), ('"calculator"', "str"), ("null", "NoneType")])
def test_parser_reports_call_body_that_is_not_an_object(body, type_name):
    calls = parse_tool_calls(call_text(body))
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCallError)
    assert f"must be a JSON object, got {type_name}" in calls[0].message


def test_parser_reports_invalid_json_and_keeps_the_raw_body():
    calls = parse_tool_calls("<tool_call>\n{'name': 'calculator'}\n</tool_call>")
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCallError)
    assert calls[0].message.startswith("invalid JSON in tool call")
    assert calls[0].raw == "{'name': 'calculator'}"


def test_parser_continues_after_invalid_json_with_closing_tag():
    text = '<tool_call>{"name": oops}</tool_call> and <tool_call>{"name": "ok"}</tool_call>'
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCallError, ToolCall]
    assert calls[1].name == "ok"


def test_parser_reports_invalid_json_without_closing_tag_at_end_of_text():
    calls = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+')
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCallError)
    assert "invalid JSON" in calls[0].message
    assert calls[0].raw.startswith('{"name": "calculator"')


def test_parser_gives_one_entry_per_opening_tag_when_invalid_json_lacks_closing_tag():
    text = '<tool_call>{"name": bad\n<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCallError, ToolCall]
    assert calls[1].name == "ok"


@pytest.mark.parametrize("text", ["<tool_call></tool_call>", "<tool_call>\n  \n</tool_call>", "<tool_call>", "x <tool_call>  "])
def test_parser_reports_empty_call(text):
    calls = parse_tool_calls(text)
    assert calls == [ToolCallError("empty tool call", "")]


def test_parser_reports_text_after_json_that_is_not_the_closing_tag():
    text = '<tool_call>{"name": "calculator", "arguments": {}} trailing words</tool_call>'
    calls = parse_tool_calls(text)
    assert len(calls) == 1
    assert isinstance(calls[0], ToolCallError)
    assert calls[0].message.startswith("unexpected text after the tool call JSON")
    assert "trailing words" in calls[0].message
    assert calls[0].raw == '{"name": "calculator", "arguments": {}}'


def test_parser_continues_after_call_with_unexpected_trailing_text():
    text = '<tool_call>{"name": "a"} junk</tool_call><tool_call>{"name": "b"}</tool_call>'
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCallError, ToolCall]
    assert calls[1].name == "b"


def test_parser_mixes_good_and_bad_calls_in_order():
    text = (
        call_text({"name": "a", "arguments": {}})
        + call_text("not json")
        + call_text({"arguments": {}})
        + call_text({"name": "d", "arguments": [1]})
        + call_text({"name": "e", "parameters": {"k": "v"}})
    )
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCall, ToolCallError, ToolCallError, ToolCall, ToolCall]
    assert calls[0].name == "a"
    assert calls[3].arguments == [1] and "must be a JSON object, got list" in calls[3].arguments_error
    assert calls[4].arguments == {"k": "v"}


def test_parser_never_raises_on_garbage():
    for text in ["<tool_call>" * 5, "<tool_call>{" * 3, "<tool_call>}}}</tool_call>", "<tool_call>\x00\ud800"]:
        calls = parse_tool_calls(text)
        assert len(calls) >= 1
        assert all(isinstance(c, (ToolCall, ToolCallError)) for c in calls)


def test_parser_results_are_immutable():
    call = parse_tool_calls(call_text({"name": "a"}))[0]
    with pytest.raises(AttributeError):
        call.name = "b"  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------- split_thought


def test_split_thought_separates_think_block_from_the_rest():
    assert split_thought("<think>\n  reason here \n</think>\nThe answer is 4.") == ("reason here", "The answer is 4.")


def test_split_thought_without_think_block_returns_text_unchanged():
    text = "  no thinking here  "
    assert split_thought(text) == ("", text)


def test_split_thought_keeps_text_before_and_after_the_block():
    assert split_thought("before <think>why</think> after") == ("why", "before  after")


def test_split_thought_accepts_unclosed_think_block():
    assert split_thought("intro <think>still thinking") == ("still thinking", "intro")


def test_split_thought_only_removes_the_first_block():
    thought, rest = split_thought("<think>one</think>mid<think>two</think>")
    assert thought == "one"
    assert rest == "mid<think>two</think>"


def test_split_thought_spans_lines_and_keeps_tool_calls_in_remainder():
    text = "<think>line 1\nline 2</think>\n" + call_text({"name": "a"})
    thought, rest = split_thought(text)
    assert thought == "line 1\nline 2"
    assert parse_tool_calls(rest)[0].name == "a"


# --------------------------------------------------------------------------------------------------- JSON arrays


def test_parser_reads_each_object_of_a_json_array_as_one_call():
    text = (
        '<tool_call>[{"name": "lookup", "arguments": {"q": "a"}}, {"name": "lookup", "arguments": {"q": "b"}}]'
        "</tool_call>"
    )
    assert parse_tool_calls(text) == [
        ToolCall(name="lookup", arguments={"q": "a"}, raw='{"name": "lookup", "arguments": {"q": "a"}}'),
        ToolCall(name="lookup", arguments={"q": "b"}, raw='{"name": "lookup", "arguments": {"q": "b"}}'),
    ]


def test_parser_reports_a_bad_array_element_alone_and_keeps_the_others():
    text = call_text('[ {"name": "a", "arguments": {"i": 1}} ,\n 7, {"arguments": {}}, "b", {"name": "c"} ]')
    calls = parse_tool_calls(text)
    assert [type(c) for c in calls] == [ToolCall, ToolCallError, ToolCallError, ToolCallError, ToolCall]
    assert (calls[0].name, calls[0].arguments, calls[0].raw) == ("a", {"i": 1}, '{"name": "a", "arguments": {"i": 1}}')
    assert calls[1] == ToolCallError("a tool call must be a JSON object, got int", "7")
    assert '"name"' in calls[2].message and calls[2].raw == '{"arguments": {}}'
    assert calls[3] == ToolCallError("a tool call must be a JSON object, got str", '"b"')
    assert calls[4] == ToolCall(name="c", arguments={}, raw='{"name": "c"}')


def test_parser_reads_an_array_between_other_blocks_in_text_order():
    text = (
        call_text({"name": "first"})
        + " and "
        + call_text([{"name": "second"}, {"name": "third"}])
        + call_text({"name": "fourth"}, close=False)
    )
    assert [c.name for c in parse_tool_calls(text)] == ["first", "second", "third", "fourth"]


def test_parser_reads_an_array_without_closing_tag_at_the_end_of_the_text():
    calls = parse_tool_calls('<tool_call>\n[{"name": "a"}, {"name": "b"}]\n')
    assert [c.name for c in calls] == ["a", "b"]


@pytest.mark.parametrize("body", ["[]", "[ \n ]"])
def test_parser_reports_an_empty_array(body):
    assert parse_tool_calls(call_text(body)) == [ToolCallError("empty array of tool calls", body)]


def test_parser_reports_an_array_that_is_not_valid_json_once():
    calls = parse_tool_calls('<tool_call>[{"name": "a"}, {"name": </tool_call>')
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError)
    assert calls[0].message.startswith("invalid JSON in tool call")


# --------------------------------------------------------------------------------------------------- hostile JSON


TOO_DEEP = f"invalid JSON in tool call: nested too deeply (more than {MAX_JSON_DEPTH} levels)"


@pytest.mark.parametrize("recursion_limit", [None, 200_000])  # libraries raise it; the outcome must not change
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 100_000])
def test_parser_refuses_json_nested_past_the_limit_whatever_the_recursion_limit(depth, recursion_limit):
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit or before)
    try:
        calls = parse_tool_calls(call_text("[" * depth + "]" * depth) + call_text({"name": "after"}))
    finally:
        sys.setrecursionlimit(before)
    assert calls == [ToolCallError(TOO_DEEP, "[" * depth + "]" * depth), ToolCall("after", {}, '{"name": "after"}')]


def test_parser_decodes_json_nested_exactly_to_the_limit():
    args = "[" * (MAX_JSON_DEPTH - 2) + "]" * (MAX_JSON_DEPTH - 2)  # + the call object and its arguments object
    body = '{"name": "f", "arguments": {"x": ' + args + "}}"
    calls = parse_tool_calls(call_text(body))
    assert len(calls) == 1 and isinstance(calls[0], ToolCall) and calls[0].arguments == {"x": json.loads(args)}
    deeper = '{"name": "f", "arguments": {"x": [' + args + "]}}"
    assert parse_tool_calls(call_text(deeper)) == [ToolCallError(TOO_DEEP, deeper)]


def test_parser_reports_deep_nesting_inside_the_call_object():
    body = '{"name": "f", "arguments": {"x": ' + "[" * 5_000 + "]" * 5_000 + "}}"
    calls = parse_tool_calls(call_text(body))
    assert calls == [ToolCallError(TOO_DEEP, body)]


@pytest.mark.parametrize(
    ("text", "exceeds"),
    [('{"a": "[[[[[[[[[["}', False), ('{"a": "\\"}' + "[" * 10, False), ('"[[[[[[[[[[' , False),
     ("  [[[[[[[[[[", True), ('{"a": "\\\"[[[[[[[[[["}', False), ("[1, [2, [3]]]", False), ("3 [[[[[[[[[[", False),
     ("[[[[[]]]]] [[[[[[[[[[", False)],
)  # fmt: skip
def test_nesting_scan_ignores_brackets_in_strings_and_after_the_first_value(text, exceeds):
    assert json_nesting_exceeds(text, 0, limit=9) is exceeds


def test_parser_reports_an_integer_past_the_digit_limit():
    body = '{"name": "f", "arguments": {"x": ' + "1" * 4_301 + "}}"
    calls = parse_tool_calls(call_text(body))
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError)
    assert calls[0].message.startswith("invalid JSON in tool call: Exceeds the limit (4300 digits)")
    assert "set_int_max_str_digits" not in calls[0].message  # the message is for the model, not for programmers
    assert calls[0].raw == body


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [("[" * 100_000, "nested too deeply"), ('{"x": ' + "9" * 5_000 + "}", "Exceeds the limit (4300 digits)")],
)
def test_parser_reports_hostile_json_in_an_arguments_string(arguments, reason):
    calls = parse_tool_calls(call_text({"name": "f", "arguments": arguments}))
    assert len(calls) == 1 and isinstance(calls[0], ToolCall) and calls[0].arguments == arguments
    assert calls[0].arguments_error.startswith("\"arguments\" of 'f' is a string that is not valid JSON: " + reason)


# --------------------------------------------------------------------------------------------------- fuzzing

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_FRAGMENTS = [TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "{", "}", "[", "]", ":", ",", '"', "\\", " ", "\n", '"name"',
              '"arguments"', '"parameters"', '"f"', "null", "true", "1", "-", ".", "e", "9" * 4_400, "[" * 3_000,
              "\\u", "\ud800", "\x00", "é", "NaN", "Infinity"]  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_NAMES = st.text(min_size=1).filter(lambda s: s.strip() == s)
_PROSE = st.text().filter(lambda s: TOOL_CALL_OPEN not in s)
_SPACE = st.sampled_from(["", "\n", " ", "\n\n", "\t "])


def _check_results(text, calls):
    assert isinstance(calls, list)
    assert bool(calls) == (TOOL_CALL_OPEN in text)  # every text with an opening tag gives at least one entry
    for call in calls:
        assert isinstance(call, (ToolCall, ToolCallError))
        if isinstance(call, ToolCall):
            assert isinstance(call.name, str) and call.name.strip() == call.name != ""
            assert isinstance(call.arguments, dict) != bool(call.arguments_error)  # an object, or the reason why not
        else:
            assert isinstance(call.message, str) and call.message


@settings(deadline=None, max_examples=300)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=8), max_size=40).map("".join))
def test_parser_never_raises_on_text_built_from_json_and_tag_pieces(text):
    _check_results(text, parse_tool_calls(text))


@settings(deadline=None, max_examples=300)
@given(st.text())
def test_parser_never_raises_on_any_text(text):
    _check_results(text, parse_tool_calls(text))


_CALLS = st.lists(
    st.tuples(_NAMES, st.dictionaries(st.text(), _JSON, max_size=4), st.booleans(), st.booleans()), min_size=1,
    max_size=5,
)  # fmt: skip


@settings(deadline=None, max_examples=150)
@given(_CALLS, st.data())
def test_well_formed_calls_round_trip_exactly(calls, data):
    """Any names and JSON arguments, written as blocks or as arrays of calls, with prose around: parsed back as written."""
    text = data.draw(_PROSE)
    expected = []
    i = 0
    while i < len(calls):
        group = data.draw(st.integers(1, len(calls) - i))  # this block holds calls[i : i + group]
        bodies = []
        for name, arguments, as_string, ascii_only in calls[i : i + group]:
            value = json.dumps(arguments, ensure_ascii=ascii_only) if as_string else arguments
            bodies.append(json.dumps({"name": name, "arguments": value}, ensure_ascii=ascii_only))
            expected.append(ToolCall(name=name, arguments=arguments, raw=bodies[-1]))
        as_array = group > 1 or data.draw(st.booleans())
        body = ("[" + ("," + data.draw(_SPACE)).join(bodies) + "]") if as_array else bodies[0]
        space = data.draw(_SPACE)
        text += TOOL_CALL_OPEN + space + body + space + TOOL_CALL_CLOSE + data.draw(_PROSE)
        i += group
    assert parse_tool_calls(text) == expected


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(alphabet='ab"\\[]{}\n'),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='k"\\[{'), inner,
                                                                                max_size=3),
                    max_leaves=20),
       st.integers(0, 8), st.sampled_from([None, 0, 2]), st.sampled_from(["", " [[[[[[[[[[", "\n<tool_call>"]))  # fmt: skip
def test_nesting_scan_agrees_with_the_depth_of_the_decoded_value(value, limit, indent, after):
    text = json.dumps(value, indent=indent) + after  # strings full of brackets, quotes and backslashes
    assert json_nesting_exceeds(text, 0, limit) is (_depth(value) > limit)


def test_nesting_scan_stops_where_the_json_ends():
    assert json_nesting_exceeds("[" * 10 + " so the answer " + "[" * 100, 0, limit=64) is False
    assert json_nesting_exceeds("[" * 10 + " true, false, null, -1.5e3, " + "[" * 100, 0, limit=64) is True
