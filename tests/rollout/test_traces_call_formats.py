"""SFT traces write their calls in the chat template's format (`call_format`), and each scripted call reads back as
the call it stands for in that format (no engine)."""

from __future__ import annotations

import pytest

from agentic_rl.parser import HERMES, LLAMA3_JSON, MISTRAL, QWEN3_CODER, TOOL_CALL_FORMATS, ToolCall, parse_tool_calls
from agentic_rl.rollout.traces import gsm8k_trace, gsm8k_traces, tool_call_text

ROW = {"question": "Tom has 3 bags of 4 apples and eats 2. How many are left?",
       "answer": "He has 3*4=<<3*4=12>>12 apples.\nHe has 12-2=<<12-2=10>>10 left.\n#### 10"}  # fmt: skip


@pytest.mark.parametrize("call_format", TOOL_CALL_FORMATS)
def test_gsm8k_trace_calls_are_written_in_the_format_and_read_back(call_format):
    trace = gsm8k_trace(ROW, 0, call_format)
    assert trace is not None and len(trace.turns) == 3
    for turn, expression in zip(trace.turns[:2], ("3*4", "12-2"), strict=True):
        (call,) = parse_tool_calls(turn, call_format=call_format)
        assert isinstance(call, ToolCall) and (call.name, call.arguments) == ("calculator", {"expression": expression})
    assert parse_tool_calls(trace.turns[-1], call_format=call_format) == []  # the final answer


def test_each_format_looks_as_its_template_writes_it():
    arguments = {"expression": "3*4"}
    assert tool_call_text("calculator", arguments) == tool_call_text("calculator", arguments, HERMES)
    assert tool_call_text("calculator", arguments).startswith("<tool_call>\n{")
    assert tool_call_text("calculator", arguments, QWEN3_CODER).startswith("<tool_call>\n<function=calculator>")
    assert tool_call_text("calculator", arguments, LLAMA3_JSON) == '{"name": "calculator", "parameters": {"expression": "3*4"}}'
    assert tool_call_text("calculator", arguments, MISTRAL).startswith('[TOOL_CALLS][{"name": "calculator"')


def test_gsm8k_traces_pass_the_format_on():
    (trace,) = gsm8k_traces([ROW], count=1, max_calls=2, call_format=LLAMA3_JSON)
    assert trace.turns[0].startswith('{"name": "calculator", "parameters": ')
