"""Unit tests of agentic_rl.environments.tool_env.ToolEnvironment (no engine: messages are written by hand)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import anyio
import pytest

from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import DEFAULT_SYSTEM_PROMPT, ToolEnvironment
from agentic_rl.errors import ConfigError, EnvStepError, ToolError
from agentic_rl.tools.base import StatefulTool, Tool
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.tools.prompt import tools_system_prompt

# --------------------------------------------------------------------------------------------------- test tools


class EchoTool(Tool):
    name = "echo"
    description = "Echo the text argument."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def execute(self, arguments: dict[str, Any]) -> str:
        self.calls.append(arguments)
        return str(arguments.get("text", ""))


class BoomTool(Tool):
    name = "boom"
    description = "Always fails."

    def execute(self, arguments: dict[str, Any]) -> str:
        raise RuntimeError("kaboom")


class ToolErrorTool(Tool):
    name = "picky"
    description = "Fails with a ToolError."

    def execute(self, arguments: dict[str, Any]) -> str:
        raise ToolError("bad input for picky")


class AsyncTool(Tool):
    name = "async_add"
    description = "Adds a and b, asynchronously."

    async def execute(self, arguments: dict[str, Any]) -> str:  # type: ignore[override]
        await anyio.sleep(0)
        return str(arguments["a"] + arguments["b"])


class DictTool(Tool):
    name = "dict_tool"
    description = "Returns a non-string result."

    def execute(self, arguments: dict[str, Any]) -> Any:
        return {"value": 3, "unit": "m"}


class BigTool(Tool):
    name = "big"
    description = "Returns a long text."

    def __init__(self, size: int) -> None:
        self.size = size

    def execute(self, arguments: dict[str, Any]) -> str:
        return "x" * self.size


class BlockingTool(Tool):
    """A synchronous tool that blocks its worker thread until released (or 30 s pass)."""

    name = "slow"
    description = "Sleeps."
    timeout_s = 0.2

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()

    def execute(self, arguments: dict[str, Any]) -> str:
        try:
            self.release.wait(30)
            return "too late"
        finally:
            self.finished.set()


class SleepingTool(Tool):
    name = "sleepy"
    description = "time.sleep beyond the timeout."
    timeout_s = 0.2

    def __init__(self) -> None:
        self.finished = threading.Event()

    def execute(self, arguments: dict[str, Any]) -> str:
        time.sleep(1.0)
        self.finished.set()
        return "woke up"


class CounterTool(StatefulTool):
    """Counts calls per session; records every session hook."""

    name = "counter"
    description = "Increments a per-session counter."

    def __init__(self, *, fail_on_end: bool = False) -> None:
        self.counts: dict[str, int] = {}
        self.started: list[str] = []
        self.ended: list[str] = []
        self.fail_on_end = fail_on_end

    def session_start(self, session_id: str) -> None:
        self.started.append(session_id)
        self.counts[session_id] = 0

    def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        self.counts[session_id] += int(arguments.get("by", 1))
        return f"{session_id}:{self.counts[session_id]}"

    def session_end(self, session_id: str) -> None:
        self.ended.append(session_id)
        self.counts.pop(session_id, None)
        if self.fail_on_end:
            raise RuntimeError("session_end exploded")


class AsyncCounterTool(StatefulTool):
    name = "acounter"
    description = "Async stateful tool."

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.ended: list[str] = []

    async def session_start(self, session_id: str) -> None:  # type: ignore[override]
        self.counts[session_id] = 100

    async def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:  # type: ignore[override]
        self.counts[session_id] += 1
        return str(self.counts[session_id])

    async def session_end(self, session_id: str) -> None:  # type: ignore[override]
        self.ended.append(session_id)


class SlowEndTool(StatefulTool):
    name = "slow_end"
    description = "session_end takes longer than timeout_s."
    timeout_s = 0.1

    def __init__(self) -> None:
        self.ended: list[str] = []

    def session_start(self, session_id: str) -> None:
        pass

    def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        return "ok"

    async def session_end(self, session_id: str) -> None:  # type: ignore[override]
        await anyio.sleep(1.0)
        self.ended.append(session_id)


# --------------------------------------------------------------------------------------------------- helpers


def call(name: str, arguments: Any = None) -> str:
    obj: dict[str, Any] = {"name": name}
    if arguments is not None:
        obj["arguments"] = arguments
    return f"<tool_call>\n{json.dumps(obj)}\n</tool_call>"


def with_reply(sample: Sample, content: str) -> Sample:
    sample.messages.append({"role": "assistant", "content": content})
    return sample


async def new_sample(env: ToolEnvironment, sample_id: Any = 0, question: str = "What is 2 + 2?") -> Sample:
    return await env.reset({"id": sample_id, "question": question, "ground_truth": "4"})


# --------------------------------------------------------------------------------------------------- construction


def test_tool_env_is_an_environment():
    assert issubclass(ToolEnvironment, Environment)


def test_tool_env_rejects_duplicate_tool_names():
    with pytest.raises(ConfigError, match="echo"):
        ToolEnvironment([EchoTool(), EchoTool()])


def test_tool_env_rejects_tool_without_name():
    class Nameless(Tool):
        def execute(self, arguments: dict[str, Any]) -> str:
            return ""

    with pytest.raises(ConfigError, match="Nameless"):
        ToolEnvironment([Nameless()])


def test_tool_env_schemas_follow_tool_order():
    env = ToolEnvironment([EchoTool(), CalculatorTool()])
    assert [s["function"]["name"] for s in env.schemas] == ["echo", "calculator"]
    assert env.schemas[1] == CalculatorTool().schema


# --------------------------------------------------------------------------------------------------- reset


async def test_reset_builds_system_and_user_messages_with_tools_in_system_prompt():
    env = ToolEnvironment([CalculatorTool(), EchoTool()], tools_in_system_prompt=True)
    sample = await env.reset({"id": 7, "question": "What is 17 * 23?", "ground_truth": "391"})
    assert isinstance(sample, Sample)
    assert [m["role"] for m in sample.messages] == ["system", "user"]
    assert sample.messages[1] == {"role": "user", "content": "What is 17 * 23?"}
    system = sample.messages[0]["content"]
    assert system.startswith(DEFAULT_SYSTEM_PROMPT)
    assert "<tool_call>" in system
    assert json.dumps(CalculatorTool().schema["function"], ensure_ascii=False) in system
    assert json.dumps(EchoTool().schema["function"], ensure_ascii=False) in system
    assert system == tools_system_prompt(DEFAULT_SYSTEM_PROMPT, env.schemas)
    assert sample.tools == env.schemas
    assert sample.id == "7"
    assert sample.task["ground_truth"] == "391"


async def test_reset_leaves_tools_out_of_system_prompt_when_disabled():
    env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=False)
    sample = await new_sample(env)
    assert sample.messages[0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert "calculator" not in sample.messages[0]["content"]
    assert "<tool_call>" not in sample.messages[0]["content"]
    assert sample.tools == [CalculatorTool().schema]


def test_for_renderer_describes_tools_in_the_system_prompt_only_when_the_template_ignores_them():
    from types import SimpleNamespace

    with_tools, without = SimpleNamespace(supports_tools=True), SimpleNamespace(supports_tools=False)
    env = ToolEnvironment.for_renderer([CalculatorTool()], with_tools)
    assert not env.tools_in_system_prompt and env.system_prompt == DEFAULT_SYSTEM_PROMPT
    env = ToolEnvironment.for_renderer([CalculatorTool()], without, "Be terse.")
    assert env.tools_in_system_prompt and env.system_prompt == "Be terse."
    assert ToolEnvironment.for_renderer([], without, "").system_prompt == ""  # an empty prompt stays empty


async def test_reset_uses_custom_system_prompt():
    env = ToolEnvironment([], system_prompt="Be terse.")
    sample = await new_sample(env)
    assert sample.messages[0] == {"role": "system", "content": "Be terse."}
    assert sample.tools == []


async def test_reset_omits_system_message_when_system_prompt_is_empty():
    env = ToolEnvironment([CalculatorTool()], system_prompt="", tools_in_system_prompt=False)
    sample = await new_sample(env, question="hi")
    assert sample.messages == [{"role": "user", "content": "hi"}]


async def test_reset_prefers_trajectory_id_over_task_id():
    env = ToolEnvironment([])
    sample = await env.reset({"id": 3, "trajectory_id": "3-rollout-1", "question": "q"})
    assert sample.id == "3-rollout-1"


@pytest.mark.parametrize("question", ["", "   ", "\n", None, 42, ["q"]])
async def test_reset_rejects_empty_or_non_string_question(question):
    env = ToolEnvironment([CalculatorTool()])
    with pytest.raises(EnvStepError, match="question"):
        await env.reset({"id": 1, "question": question})


async def test_reset_rejects_missing_question():
    env = ToolEnvironment([CalculatorTool()])
    with pytest.raises(EnvStepError):
        await env.reset({"id": 1})


async def test_reset_gives_each_sample_its_own_message_list():
    env = ToolEnvironment([CalculatorTool()])
    a, b = await new_sample(env, 1), await new_sample(env, 2)
    a.messages.append({"role": "assistant", "content": "x"})
    assert len(b.messages) == 2


# --------------------------------------------------------------------------------------------------- step


async def test_step_without_tool_call_ends_the_trajectory_with_empty_observation():
    env = ToolEnvironment([CalculatorTool()])
    sample = with_reply(await new_sample(env), "The answer is 4.")
    result = await env.step(sample)
    assert isinstance(result, StepResult)
    observation, done, info = result
    assert observation == []
    assert done is True
    assert info == {"tool_calls": 0, "tool_errors": 0, "well_formed_calls": 0}


async def test_step_runs_a_calculator_call():
    env = ToolEnvironment([CalculatorTool()])
    sample = with_reply(await new_sample(env), "Let me compute. " + call("calculator", {"expression": "2 + 2"}))
    observation, done, info = await env.step(sample)
    assert observation == [{"role": "tool", "content": "4"}]
    assert done is False
    assert info == {"tool_calls": 1, "tool_errors": 0, "well_formed_calls": 1}


async def test_step_returns_one_tool_message_per_call_in_order():
    echo = EchoTool()
    env = ToolEnvironment([echo, CalculatorTool()])
    content = (
        call("echo", {"text": "first"})
        + call("calculator", {"expression": "6*7"})
        + "\n"
        + call("echo", {"text": "third"})
    )
    observation, done, info = await env.step(with_reply(await new_sample(env), content))
    assert observation == [
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "42"},
        {"role": "tool", "content": "third"},
    ]
    assert done is False
    assert info["tool_calls"] == 3
    assert info["tool_errors"] == 0
    assert info["well_formed_calls"] == 3
    assert echo.calls == [{"text": "first"}, {"text": "third"}]


async def test_step_does_not_modify_the_sample_messages():
    env = ToolEnvironment([CalculatorTool()])
    sample = with_reply(await new_sample(env), call("calculator", {"expression": "1+1"}))
    before = [dict(m) for m in sample.messages]
    await env.step(sample)
    assert sample.messages == before


async def test_step_reports_unknown_tool_as_error_text():
    env = ToolEnvironment([CalculatorTool(), EchoTool()])
    sample = with_reply(await new_sample(env), call("search", {"q": "x"}))
    observation, done, info = await env.step(sample)
    assert done is False
    assert len(observation) == 1
    assert observation[0]["role"] == "tool"
    text = observation[0]["content"]
    assert text.startswith("Error:")
    assert "unknown tool 'search'" in text
    assert "calculator, echo" in text
    assert info == {"tool_calls": 1, "tool_errors": 1, "well_formed_calls": 1}


async def test_step_reports_invalid_json_as_error_text():
    env = ToolEnvironment([CalculatorTool()])
    sample = with_reply(await new_sample(env), "<tool_call>{'name': 'calculator'}</tool_call>")
    observation, done, info = await env.step(sample)
    assert done is False
    assert observation[0]["role"] == "tool"
    assert observation[0]["content"].startswith("Error: invalid JSON in tool call")
    assert info == {"tool_calls": 1, "tool_errors": 1, "well_formed_calls": 0}


async def test_step_reports_non_object_arguments_as_error_text():
    env = ToolEnvironment([CalculatorTool()])
    sample = with_reply(await new_sample(env), call("calculator", ["2+2"]))
    observation, done, info = await env.step(sample)
    assert done is False
    assert observation[0]["content"].startswith("Error:")
    assert "must be a JSON object, got list" in observation[0]["content"]
    assert info["tool_errors"] == 1
    assert info["well_formed_calls"] == 0


async def test_step_counts_errors_among_good_calls():
    env = ToolEnvironment([CalculatorTool(), BoomTool()])
    content = (
        call("calculator", {"expression": "3*3"})
        + call("nope")
        + "<tool_call>not json</tool_call>"
        + call("boom", {})
        + call("calculator", {"expression": "1/0"})
        + call("calculator", {"expression": "10-1"})
    )
    observation, done, info = await env.step(with_reply(await new_sample(env), content))
    texts = [m["content"] for m in observation]
    assert len(texts) == 6
    assert texts[0] == "9"
    assert texts[1].startswith("Error: unknown tool")
    assert texts[2].startswith("Error: invalid JSON")
    assert texts[3].startswith("Error: tool 'boom' failed")
    assert texts[4] == "Error: division by zero"
    assert texts[5] == "9"
    assert info == {"tool_calls": 6, "tool_errors": 4, "well_formed_calls": 5,
                    "infrastructure_errors": [texts[3].removeprefix("Error: ")]}  # fmt: skip  (a crash: the tool's)
    assert done is False


async def test_step_runs_each_call_of_a_json_array_and_answers_a_bad_element_alone():
    env = ToolEnvironment([CalculatorTool(), EchoTool()])
    content = (
        '<tool_call>\n[{"name": "calculator", "arguments": {"expression": "6*7"}}, 5, '
        '{"name": "echo", "arguments": {"text": "b"}}]\n</tool_call>'
    )
    observation, done, info = await env.step(with_reply(await new_sample(env), content))
    assert [m["content"] for m in observation] == [
        "42",
        "Error: a tool call must be a JSON object, got int",
        "b",
    ]
    assert info == {"tool_calls": 3, "tool_errors": 1, "well_formed_calls": 2}
    assert done is False


async def test_step_answers_hostile_json_with_error_text():
    env = ToolEnvironment([CalculatorTool()])
    content = "<tool_call>" + "[" * 2_000 + "</tool_call>" + call("calculator", {"expression": "1+1"})
    observation, done, info = await env.step(with_reply(await new_sample(env), content))
    assert [m["content"] for m in observation] == ["Error: invalid JSON in tool call: nested too deeply (more than 64 levels)", "2"]
    assert info == {"tool_calls": 2, "tool_errors": 1, "well_formed_calls": 1}


async def test_step_reports_calculator_tool_error_message():
    env = ToolEnvironment([CalculatorTool()])
    sample = with_reply(await new_sample(env), call("calculator", {"expression": "__import__('os')"}))
    observation, _, info = await env.step(sample)
    assert observation[0]["content"].startswith("Error: not allowed in an arithmetic expression")
    assert info["tool_errors"] == 1


async def test_step_reports_tool_error_text_without_traceback():
    env = ToolEnvironment([ToolErrorTool()])
    observation, _, info = await env.step(with_reply(await new_sample(env), call("picky", {})))
    assert observation == [{"role": "tool", "content": "Error: bad input for picky"}]
    assert info["tool_errors"] == 1


async def test_step_turns_arbitrary_tool_exception_into_error_text():
    env = ToolEnvironment([BoomTool()])
    observation, done, info = await env.step(with_reply(await new_sample(env), call("boom", {"x": 1})))
    assert observation == [{"role": "tool", "content": "Error: tool 'boom' failed: RuntimeError: kaboom"}]
    assert done is False
    assert info["tool_errors"] == 1


async def test_step_times_out_a_blocking_synchronous_tool_and_returns():
    tool = BlockingTool()
    env = ToolEnvironment([tool])
    sample = with_reply(await new_sample(env), call("slow", {}))
    try:
        # Hang guard only: if the environment did not abandon the blocked thread, this would raise.
        with anyio.fail_after(20):
            observation, done, info = await env.step(sample)
        # the tool is still blocked in its thread when the step has already answered
        assert not tool.finished.is_set()
    finally:
        tool.release.set()
        await anyio.to_thread.run_sync(tool.finished.wait, 30)
    assert observation == [{"role": "tool", "content": "Error: tool 'slow' timed out after 0.2 s"}]
    assert done is False
    assert info["tool_errors"] == 1


async def test_step_times_out_a_tool_sleeping_beyond_its_timeout():
    tool = SleepingTool()
    env = ToolEnvironment([tool, CalculatorTool()])
    content = call("sleepy", {}) + call("calculator", {"expression": "1+1"})
    try:
        observation, done, info = await env.step(with_reply(await new_sample(env), content))
    finally:
        # let the abandoned worker thread finish before the event loop closes
        await anyio.to_thread.run_sync(tool.finished.wait, 30)
    assert observation[0]["content"] == "Error: tool 'sleepy' timed out after 0.2 s"
    assert observation[1]["content"] == "2"
    assert info == {"tool_calls": 2, "tool_errors": 1, "well_formed_calls": 2,
                    "infrastructure_errors": ["tool 'sleepy' timed out after 0.2 s"]}  # fmt: skip


async def test_step_runs_an_async_tool():
    env = ToolEnvironment([AsyncTool()])
    observation, done, info = await env.step(with_reply(await new_sample(env), call("async_add", {"a": 2, "b": 40})))
    assert observation == [{"role": "tool", "content": "42"}]
    assert info["tool_errors"] == 0


async def test_step_serializes_non_string_tool_result_as_json():
    env = ToolEnvironment([DictTool()])
    observation, _, info = await env.step(with_reply(await new_sample(env), call("dict_tool", {})))
    assert json.loads(observation[0]["content"]) == {"value": 3, "unit": "m"}
    assert info["tool_errors"] == 0


async def test_step_cuts_long_observation_with_marker():
    env = ToolEnvironment([BigTool(25)], max_observation_chars=10)
    observation, _, info = await env.step(with_reply(await new_sample(env), call("big", {})))
    assert observation == [{"role": "tool", "content": "x" * 10 + "\n...[truncated 15 characters]"}]
    assert info["tool_errors"] == 0


async def test_step_keeps_observation_of_exactly_the_limit():
    env = ToolEnvironment([BigTool(10)], max_observation_chars=10)
    observation, _, _ = await env.step(with_reply(await new_sample(env), call("big", {})))
    assert observation[0]["content"] == "x" * 10


async def test_step_cuts_long_error_text_too():
    env = ToolEnvironment([CalculatorTool()], max_observation_chars=12)
    observation, _, _ = await env.step(with_reply(await new_sample(env), call("missing_tool_with_long_name")))
    content = observation[0]["content"]
    assert content.startswith("Error: unkno")
    assert "\n...[truncated " in content


async def test_step_default_observation_cap_is_8192():
    env = ToolEnvironment([BigTool(9000)])
    observation, _, _ = await env.step(with_reply(await new_sample(env), call("big", {})))
    assert observation[0]["content"] == "x" * 8192 + "\n...[truncated 808 characters]"


async def test_step_requires_the_latest_message_to_be_the_assistants():
    env = ToolEnvironment([CalculatorTool()])
    sample = await new_sample(env)
    with pytest.raises(EnvStepError):
        await env.step(sample)


async def test_step_requires_messages():
    env = ToolEnvironment([CalculatorTool()])
    with pytest.raises(EnvStepError):
        await env.step(Sample(id="s", task={}, messages=[]))


# --------------------------------------------------------------------------------------------------- stateful tools


async def test_stateful_tool_keeps_state_across_calls_of_the_same_sample():
    tool = CounterTool()
    env = ToolEnvironment([tool])
    sample = await new_sample(env, "a")
    obs1, _, _ = await env.step(with_reply(sample, call("counter", {"by": 1})))
    sample.messages.extend(obs1)
    obs2, _, _ = await env.step(with_reply(sample, call("counter", {"by": 2}) + call("counter", {"by": 3})))
    assert [m["content"] for m in obs1] == ["a:1"]
    assert [m["content"] for m in obs2] == ["a:3", "a:6"]
    assert tool.started == ["a"]
    await env.close(sample)


async def test_stateful_tool_keeps_separate_state_for_two_samples():
    tool = CounterTool()
    env = ToolEnvironment([tool])
    a, b = await new_sample(env, "a"), await new_sample(env, "b")
    obs_a1, _, _ = await env.step(with_reply(a, call("counter", {"by": 5})))
    obs_b1, _, _ = await env.step(with_reply(b, call("counter", {"by": 1})))
    obs_a2, _, _ = await env.step(with_reply(a, call("counter", {"by": 1})))
    assert obs_a1[0]["content"] == "a:5"
    assert obs_b1[0]["content"] == "b:1"
    assert obs_a2[0]["content"] == "a:6"
    assert sorted(tool.started) == ["a", "b"]
    await env.close(a)
    assert tool.ended == ["a"]
    assert tool.counts == {"b": 1}
    await env.close(b)
    assert tool.ended == ["a", "b"]


async def test_stateful_tool_session_starts_once_per_session_and_concurrent_samples_stay_apart():
    tool = CounterTool()
    env = ToolEnvironment([tool])
    samples = [await new_sample(env, f"s{i}") for i in range(5)]
    results: dict[str, list[str]] = {}

    async def drive(sample: Sample) -> None:
        out = []
        for _ in range(3):
            obs, _, _ = await env.step(with_reply(sample, call("counter", {})))
            out.append(obs[0]["content"])
        results[sample.id] = out

    async with anyio.create_task_group() as tg:
        for sample in samples:
            tg.start_soon(drive, sample)
    for sample in samples:
        assert results[sample.id] == [f"{sample.id}:1", f"{sample.id}:2", f"{sample.id}:3"]
    assert sorted(tool.started) == sorted(s.id for s in samples)
    for sample in samples:
        await env.close(sample)
    assert sorted(tool.ended) == sorted(s.id for s in samples)


async def test_close_calls_session_end_exactly_once_and_is_idempotent():
    tool = CounterTool()
    env = ToolEnvironment([tool])
    sample = await new_sample(env, "x")
    await env.step(with_reply(sample, call("counter", {})))
    await env.close(sample)
    assert tool.ended == ["x"]
    await env.close(sample)
    assert tool.ended == ["x"]


async def test_close_without_any_stateful_call_does_not_call_session_end():
    tool = CounterTool()
    env = ToolEnvironment([tool, CalculatorTool()])
    sample = await new_sample(env, "y")
    await env.step(with_reply(sample, call("calculator", {"expression": "1+1"})))
    await env.close(sample)
    assert tool.started == []
    assert tool.ended == []


async def test_close_does_not_raise_when_session_end_raises():
    tool = CounterTool(fail_on_end=True)
    env = ToolEnvironment([tool])
    sample = await new_sample(env, "z")
    await env.step(with_reply(sample, call("counter", {})))
    await env.close(sample)  # must not raise
    assert tool.ended == ["z"]
    await env.close(sample)
    assert tool.ended == ["z"]


async def test_new_session_after_close_starts_again():
    tool = CounterTool()
    env = ToolEnvironment([tool])
    sample = await new_sample(env, "r")
    await env.step(with_reply(sample, call("counter", {"by": 4})))
    await env.close(sample)
    again = await new_sample(env, "r")
    obs, _, _ = await env.step(with_reply(again, call("counter", {})))
    assert obs[0]["content"] == "r:1"
    assert tool.started == ["r", "r"]
    await env.close(again)
    assert tool.ended == ["r", "r"]


async def test_async_stateful_tool_hooks_are_awaited():
    tool = AsyncCounterTool()
    env = ToolEnvironment([tool])
    sample = await new_sample(env, "q")
    obs1, _, _ = await env.step(with_reply(sample, call("acounter", {})))
    obs2, _, _ = await env.step(with_reply(sample, call("acounter", {})))
    assert [obs1[0]["content"], obs2[0]["content"]] == ["101", "102"]
    await env.close(sample)
    assert tool.ended == ["q"]


def test_stateful_tool_refuses_plain_execute():
    with pytest.raises(TypeError, match="stateful"):
        CounterTool().execute({})


async def test_close_gives_up_on_session_end_after_tool_timeout():
    tool = SlowEndTool()
    env = ToolEnvironment([tool])
    sample = await new_sample(env, "slow")
    await env.step(with_reply(sample, call("slow_end", {})))
    await env.close(sample)
    # with a working timeout (0.1 s), close returns before the 1 s session_end completes
    assert tool.ended == []


async def test_aclose_closes_every_tool_once_and_survives_a_failing_one():
    closed: list[str] = []

    class Holding(Tool):
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def execute(self, arguments):
            return "ok"

        async def aclose(self) -> None:
            closed.append(self.name)
            if self.fail:
                raise RuntimeError("cannot close")

    env = ToolEnvironment([Holding("a", fail=True), Holding("b"), CalculatorTool()])
    await env.aclose()
    assert closed == ["a", "b"]  # the failing one is logged, the next one still closed


# ------------------------------------------------------------------------------- call_tool (OpenAI-style calls)


async def test_call_tool_runs_openai_style_calls_with_the_sessions_and_error_texts_of_step():
    counter = CounterTool()
    env = ToolEnvironment([EchoTool(), counter, BoomTool(), SleepingTool()])
    sample = await env.reset({"question": "q", "id": "s1"})
    # Arguments as the OpenAI client hands them over (a JSON string), as an object, or none at all.
    assert await env.call_tool(sample, "echo", '{"text": "hi"}') == ("hi", True, False)
    assert await env.call_tool(sample, "counter", {"by": 2}) == ("s1:2", True, False)
    assert await env.call_tool(sample, "counter", None) == ("s1:3", True, False)  # the session is kept
    assert counter.started == ["s1"]
    # The policy's mistakes: the texts `step` gives, not an exception.
    reply = await env.call_tool(sample, "echo", '{"text": ')
    assert not reply.ok and not reply.infrastructure and "not valid JSON" in reply.content
    reply = await env.call_tool(sample, "echo", "[1, 2]")
    assert not reply.ok and "must be a JSON object" in reply.content and '"text"' in reply.content
    reply = await env.call_tool(sample, "nope", "{}")
    assert reply.content.startswith("Error: unknown tool 'nope'") and not reply.infrastructure
    # The tool's own failures are infrastructure failures.
    reply = await env.call_tool(sample, "boom", "{}")
    assert not reply.ok and reply.infrastructure and "kaboom" in reply.content
    reply = await env.call_tool(sample, "sleepy", "{}")
    assert not reply.ok and reply.infrastructure and "timed out" in reply.content
    await env.close(sample)
    assert counter.ended == ["s1"]


async def test_call_tool_cuts_long_results_like_step():
    env = ToolEnvironment([EchoTool()], max_observation_chars=10)
    sample = await env.reset({"question": "q", "id": "s2"})
    reply = await env.call_tool(sample, "echo", {"text": "x" * 25})
    assert reply.content == "x" * 10 + "\n...[truncated 15 characters]"
