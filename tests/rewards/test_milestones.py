"""Milestone rewards: a turn whose tool results first show one of the task's `milestones` earns
`milestone_weight / len(milestones)` in its `Step.reward`; `trajectory_reward` is unchanged; a malformed list fails
only its trajectory; the training config refuses the weight without step-level advantages."""

from __future__ import annotations

import pytest
from support.engines import SteeredEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import EnvStepError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rewards.turns import milestone_reward, task_milestones
from agentic_rl.rollout.harness import HarnessConfig
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

WEIGHT = 0.6


def _call(expression: str) -> str:
    body = '{"name": "calculator", "arguments": {"expression": "' + expression + '"}}'
    return (
        "<tool_call>\n"
        + body.replace("{", r"\{").replace("}", r"\}").replace("*", r"\*").replace("+", r"\+")
        + "\n</tool_call>"
    )


def test_a_milestone_counts_once_as_a_whole_word():
    reached: set[str] = set()
    assert milestone_reward(["193", "1620"], reached, ["193"], 1.0) == 0.5 and reached == {"193"}
    assert milestone_reward(["193", "1620"], reached, ["193", "so 1620 in all"], 1.0) == 0.5  # 193 counted already
    assert milestone_reward(["193", "1620"], reached, ["1620"], 1.0) == 0.0
    for text in ("1930", "-193", "193.5", "0.193", "x193", "1,193", "193,000"):
        assert milestone_reward(["193"], set(), [text], 1.0) == 0.0, text
    for text in ("= 193", "193 apples", "193.", "(193)"):
        assert milestone_reward(["193"], set(), [text], 1.0) == 1.0, text
    assert milestone_reward(["Paris"], set(), ["Title: Paris (city)"], 0.2) == pytest.approx(0.2)
    assert milestone_reward([], set(), ["anything"], 1.0) == 0.0
    echoed = '<tool_call>{"name": "search", "arguments": {"query": "hp00001"}}</tool_call>'
    assert milestone_reward(["hp00001"], reached := set(), ['Results for "hp00001": none'], 1.0, action=echoed) == 0
    assert reached == set() and milestone_reward(["hp00001"], reached, ["hp00001: Paris"], 1.0, action="") == 1.0
    for spelling in (
        "193",
        "193.0",
        "193e0",
        "1,93",
        "1_93",
        "+193",
        "(193)",
        "-193",
        "-(-193)",
    ):  # the value, however written
        assert milestone_reward(["193"], set(), ["193"], 1.0, action=f'{{"expression": "{spelling}"}}') == 0, spelling
    assert milestone_reward(["193"], set(), ["193"], 1.0, action='{"expression": "200-7"}') == 1.0  # computed
    query = '<tool_call>{"name": "search", "arguments": {"query": "Paris population"}}</tool_call>'
    assert milestone_reward(["Paris"], set(), ['Results for "Paris population": no match'], 1.0, action=query) == 0
    assert milestone_reward(["Paris"], set(), ['Results for "Paris population":\n1. Paris (city)'], 1.0,
                            action=query) == 1.0  # found through a result, not the echoed query  # fmt: skip
    found = '<tool_call>{"name": "search", "arguments": {"query": "Magazine"}}</tool_call>'  # part of the title
    assert milestone_reward(["Arthur's Magazine"], set(), ["1. Arthur's Magazine (1844)"], 1.0, action=found) == 1.0
    visit = '<tool_call>{"name": "visit", "arguments": {"id": "hp00042"}}</tool_call>'
    assert milestone_reward(["hp00042"], set(), ["[hp00042] Paris"], 1.0, action=visit) == 0  # the id it wrote
    calc = '<tool_call>{"name": "calculator", "arguments": {"expression": "max(12, 7)", "note": "step2"}}</tool_call>'
    assert milestone_reward(["2"], set(), ["2"], 1.0, action=calc) == 1.0  # only whole argument numbers count
    broken = "<tool_call>{not json: Paris</tool_call>"
    assert milestone_reward(["Paris"], set(), ["Error: {not json: Paris"], 1.0, action=broken) == 0


def test_milestones_must_be_a_list_of_non_empty_strings():
    assert task_milestones({}) == [] and task_milestones({"milestones": ["4", " 4 ", "5"]}) == ["4", "5"]
    for bad in ("42", [42], [""], ["4", None]):
        with pytest.raises(EnvStepError, match="'milestones' must be a list of non-empty strings"):
            task_milestones({"milestones": bad})


async def test_each_turn_earns_the_milestones_its_tool_results_first_show(engine, tokenizer):
    """Turn 0 computes 6*7 = 42 and turn 1 42+1 = 43 (the real engine samples them under a regex); the tasks' milestones
    say which of those results count."""
    milestones = {0: ["42", "43", "99"], 1: ["43"], 2: ["42", "42.0"], 3: ["4", "7"], 4: "43"}
    trajectories = await _steered_rollout(engine, tokenizer, ["6*7", "42+1"], milestones)
    answer = {i: t.metrics["res_reward"] for i, t in trajectories.items() if not t.failed}
    expected = {0: [WEIGHT / 3, WEIGHT / 3, answer.get(0)], 1: [0.0, WEIGHT, answer.get(1)],
                2: [WEIGHT / 2, 0.0, answer.get(2)], 3: [0.0, 0.0, answer.get(3)]}  # fmt: skip
    for i, rewards in expected.items():
        t = trajectories[i]
        assert not t.failed and len(t.steps) == 3, t.error
        assert [m["content"] for m in t.chat_completions if m["role"] == "tool"] == ["42", "43"]
        assert [s.reward for s in t.steps] == pytest.approx(rewards, abs=1e-12)
        assert t.trajectory_reward == t.metrics["res_reward"]  # milestones are step rewards only
    bad = trajectories[4]
    assert bad.failed and "'milestones' must be a list of non-empty strings" in bad.error


async def test_a_milestone_the_call_itself_writes_is_not_reached_by_its_echo(engine, tokenizer):
    """A calculator given the value returns it: turn 0 writes `43` and is not paid; turn 1 computes 42+1 and is."""
    trajectories = await _steered_rollout(engine, tokenizer, ["43", "42+1"], {0: ["43"]})
    t = trajectories[0]
    assert not t.failed and [m["content"] for m in t.chat_completions if m["role"] == "tool"] == ["43", "43"], t.error
    assert [s.reward for s in t.steps] == pytest.approx([0.0, WEIGHT, t.metrics["res_reward"]], abs=1e-12)


async def _steered_rollout(engine, tokenizer, expressions: list[str], milestones: dict[int, object]) -> dict:
    """Tasks "What is 6 * 7 plus 1?" with the given milestones, rolled out for 3 turns on the real engine, turn k
    sampled under a regex that writes a calculator call of `expressions[k]`; trajectories by task index."""
    calls = {k: _call(expression) for k, expression in enumerate(expressions)}
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": calls[turn]} if turn in calls else {})
    renderer = ChatRenderer(tokenizer)
    environment = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    config = HarnessConfig(max_steps=3, max_prompt_length=1024, max_response_length=512, toolcall_weight=0.0,
                           milestone_weight=WEIGHT, sampling={"temperature": 1.0, "max_tokens": 48, "seed": 3})  # fmt: skip
    spec = RolloutSpec(steered, environment, renderer, config, reward_fn=gsm8k_reward)
    tasks = [{"id": i, "question": "What is 6 * 7 plus 1?", "ground_truth": "43", "milestones": m}
             for i, m in milestones.items()]  # fmt: skip
    return {t.idx: t for t in (await Rollout(spec, n_parallel_agents=len(tasks)).run(tasks)).trajectories}


def test_the_training_config_refuses_milestones_without_step_level_advantages():
    with pytest.raises(ValueError, match="only optimizer.advantage: step learns from it"):
        TrainConfig(rollout={"milestone_weight": 0.5})
    assert (
        TrainConfig(rollout={"milestone_weight": 0.5}, optimizer={"advantage": "step"}).rollout.milestone_weight == 0.5
    )
