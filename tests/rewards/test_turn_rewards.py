"""Per-turn rewards on the real engine: every `Step.reward` of the harness, the environment's own `info["reward"]`,
and a bad one failing only its trajectory."""

from __future__ import annotations

from typing import Any

import pytest
from support.engines import ForcedCallEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.harness import HarnessConfig
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

WEIGHT = 0.1  # HarnessConfig.toolcall_weight's default


class _TurnRewardEnv(Environment):
    """The calculator environment, adding `info["reward"] = rewards(task id, turn)` to each step (None: no key)."""

    def __init__(self, inner: ToolEnvironment, rewards: Any) -> None:
        self.inner = inner
        self.rewards = rewards
        self.turns: dict[str, int] = {}

    async def reset(self, request: dict[str, Any]) -> Sample:
        return await self.inner.reset(request)

    async def step(self, sample: Sample) -> StepResult:
        result = StepResult.of(await self.inner.step(sample))
        turn = self.turns[sample.id] = self.turns.get(sample.id, -1) + 1
        reward = self.rewards(sample.task["id"], turn)
        return (
            result if reward is None else StepResult(result.observation, result.done, {**result.info, "reward": reward})
        )

    async def close(self, sample: Sample) -> None:
        await self.inner.close(sample)


async def _rollout(engine, tokenizer, environment, *, forced_turns: int, n: int = 6) -> list[Any]:
    renderer = ChatRenderer(tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=1024, max_response_length=512,
                           sampling={"temperature": 1.0, "max_tokens": 64, "seed": 7})  # fmt: skip
    spec = RolloutSpec(ForcedCallEngine(engine, tokenizer, forced_turns=forced_turns), environment, renderer, config,
                       reward_fn=gsm8k_reward)  # fmt: skip
    tasks = [{"id": i, "question": f"What is {i + 3} * 7? Use the calculator.", "ground_truth": str((i + 3) * 7)}
             for i in range(n)]  # fmt: skip
    return list((await Rollout(spec, n_parallel_agents=n).run(tasks)).trajectories)


def _tool_env(tokenizer) -> ToolEnvironment:
    return ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not ChatRenderer(tokenizer).supports_tools)


def _share(t: Any, k: int) -> float:
    """Turn k's part of the tool-call reward, and the answer's reward on the last turn."""
    step, calls = t.steps[k], t.metrics["tool_calls"]
    share = WEIGHT * int(step.info.get("well_formed_calls", 0)) / calls if calls and not t.failed else 0.0
    return share + (t.metrics["res_reward"] if k == len(t.steps) - 1 else 0.0)


@pytest.mark.parametrize("forced_turns", [0, 1, 2])
async def test_step_rewards_add_up_to_the_trajectory_reward_whatever_the_model_writes(engine, tokenizer, forced_turns):
    trajectories = await _rollout(engine, tokenizer, _tool_env(tokenizer), forced_turns=forced_turns)
    for t in trajectories:
        assert t.steps, t.error
        assert sum(s.reward for s in t.steps) == pytest.approx(t.trajectory_reward, abs=1e-12)
        assert [s.reward for s in t.steps] == pytest.approx([_share(t, k) for k in range(len(t.steps))], abs=1e-12)
    if forced_turns == 2:  # two forced, well-formed calls: each turn's share is half the weight
        done = [t for t in trajectories if not t.failed and t.metrics["tool_calls"] == 2]
        assert done and all(t.steps[0].reward == pytest.approx(WEIGHT / 2) for t in done)


async def test_the_environments_own_turn_reward_goes_to_that_turn_only(engine, tokenizer):
    env = _TurnRewardEnv(_tool_env(tokenizer), lambda task_id, turn: 0.25 * (turn + 1))
    trajectories = await _rollout(engine, tokenizer, env, forced_turns=1)
    for t in trajectories:
        assert not t.failed, t.error
        stepped = [k for k, s in enumerate(t.steps) if "env_time_s" in s.info]  # turns the environment reacted to
        assert stepped[0] == 0
        own = [0.25 * (stepped.index(k) + 1) if k in stepped else 0.0 for k in range(len(t.steps))]
        assert [s.reward for s in t.steps] == pytest.approx([o + _share(t, k) for k, o in enumerate(own)], abs=1e-12)
        # trajectory_reward is the answer and the tool calls only, as without per-turn rewards
        assert t.trajectory_reward == t.metrics["res_reward"] + t.metrics["toolcall_reward"]
        assert sum(s.reward for s in t.steps) == pytest.approx(t.trajectory_reward + sum(own), abs=1e-12)


async def test_a_bad_turn_reward_fails_only_its_trajectory_naming_the_turn(engine, tokenizer):
    bad = {(1, 1): float("nan"), (2, 0): "0.5", (3, 0): True}
    env = _TurnRewardEnv(_tool_env(tokenizer), lambda task_id, turn: bad.get((task_id, turn), 1.0))
    trajectories = await _rollout(engine, tokenizer, env, forced_turns=2)
    messages = {1: "turn 1: step() returned info['reward']=nan", 2: "turn 0: step() returned info['reward']='0.5'",
                3: "turn 0: step() returned info['reward']=True"}  # fmt: skip
    for t in trajectories:
        if t.idx in messages:
            assert t.failed and t.termination_reason == "error" and t.trajectory_reward == 0.0
            assert t.error.startswith("EnvStepError: ") and messages[t.idx] in t.error
            assert "a per-turn reward must be a finite number" in t.error
        else:
            assert not t.failed, t.error
            assert t.steps[0].reward == pytest.approx(1.0 + _share(t, 0))
