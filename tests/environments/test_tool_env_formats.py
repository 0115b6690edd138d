"""`ToolEnvironment` with the tool-call forms beyond a Hermes JSON block: Qwen3-Coder XML calls run against real tools
(their values typed by the tool's schema), calls inside reasoning ignored, arguments that are not a JSON object
answered with what the tool expected (no engine: messages are written by hand)."""

from __future__ import annotations

import json
from typing import Any

from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.tools.base import Tool
from agentic_rl.tools.calculator import CalculatorTool


class RepeatTool(Tool):
    """Records the arguments it gets (their types included)."""

    name = "repeat"
    description = "Repeat a word."
    parameters = {"type": "object", "properties": {"word": {"type": "string"}, "times": {"type": "integer"},
                  "loud": {"type": "boolean"}, "extra": {"type": "object"}}, "required": ["word", "times"]}  # fmt: skip

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def execute(self, arguments: dict[str, Any]) -> str:
        self.calls.append(arguments)
        word = arguments["word"] * arguments["times"]
        return word.upper() if arguments.get("loud") else word


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def hermes_call(name: str, arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def step(env: ToolEnvironment, content: str):
    sample = await env.reset({"id": "t", "question": "What is 6 * 7?"})
    sample.messages.append({"role": "assistant", "content": content})
    return await env.step(sample)


async def test_an_xml_call_runs_the_calculator():
    env = ToolEnvironment([CalculatorTool()])
    observation, done, info = await step(env, "Let me compute.\n" + xml_call("calculator", expression="6 * 7"))
    assert observation == [{"role": "tool", "content": "42"}]
    assert done is False
    assert info == {"tool_calls": 1, "tool_errors": 0, "well_formed_calls": 1}


async def test_xml_values_reach_the_tool_with_the_types_of_its_schema():
    tool = RepeatTool()
    env = ToolEnvironment([tool, CalculatorTool()])
    content = (xml_call("repeat", word="ab", times="3", loud="true", extra='{"k": [1]}') + "\n"
               + xml_call("calculator", expression="2 + 3"))  # fmt: skip
    observation, _, info = await step(env, content)
    assert [m["content"] for m in observation] == ["ABABAB", "5"]
    assert tool.calls == [{"word": "ab", "times": 3, "loud": True, "extra": {"k": [1]}}]
    assert info == {"tool_calls": 2, "tool_errors": 0, "well_formed_calls": 2}


async def test_calls_inside_reasoning_are_not_run():
    tool = RepeatTool()
    env = ToolEnvironment([tool, CalculatorTool()])
    sketch = hermes_call("repeat", {"word": "x", "times": 1}) + xml_call("repeat", word="y", times="1")
    observation, done, info = await step(env, f"<think>I might call {sketch}</think>\nThe answer is 42.")
    assert (observation, done) == ([], True)  # a final answer
    assert info["tool_calls"] == 0
    observation, done, _ = await step(env, f"<think>maybe {sketch}</think>\n" + xml_call("calculator", expression="6*7"))
    assert observation == [{"role": "tool", "content": "42"}] and done is False
    observation, done, _ = await step(env, f"<think>cut off while sketching {sketch}")
    assert (observation, done) == ([], True)
    observation, done, _ = await step(env, f"reasoning the prompt opened: {sketch}</think>\nThe answer is 42.")
    assert (observation, done) == ([], True)
    assert tool.calls == []


async def test_arguments_that_are_not_an_object_are_answered_with_what_the_tool_expected():
    env = ToolEnvironment([RepeatTool()])
    expected = json.dumps(RepeatTool.parameters)
    for arguments, reason in [("ab three times", "is a string that is not valid JSON"),
                              (["ab", 3], "must be a JSON object, got list"), (3, "must be a JSON object, got int")]:  # fmt: skip
        observation, done, info = await step(env, hermes_call("repeat", arguments))
        text = observation[0]["content"]
        assert text.startswith("Error: ") and reason in text and "'repeat'" in text and text.endswith(expected)
        assert done is False
        assert info == {"tool_calls": 1, "tool_errors": 1, "well_formed_calls": 0}


async def test_arguments_given_as_a_json_string_of_an_object_run():
    tool = RepeatTool()
    env = ToolEnvironment([tool])
    observation, _, info = await step(env, hermes_call("repeat", json.dumps({"word": "ab", "times": 2})))
    assert observation == [{"role": "tool", "content": "abab"}]
    assert info["well_formed_calls"] == 1
