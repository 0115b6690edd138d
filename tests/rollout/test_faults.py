"""Faults injected into a rollout: each affected trajectory ends as failed with its reason (a tool's failure also as
error text the model saw), failures outside the policy with their kind after their retries, is excluded from GRPO
statistics, its siblings finish normally and `close` runs once per attempt.

The engine is `ScriptedEngine` (deterministic, no model) so that every fault lands on a known turn; the tokenizer,
chat template, environment, tools, harness, packing and advantages are the real ones.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import anyio
import pytest
import torch
from support.engines import DelegatingEngine, ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import MAX_OBSERVATION_CHARS, ToolEnvironment
from agentic_rl.errors import EnvStepError
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.base import Tool
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.train.advantages import group_advantages
from agentic_rl.train.packing import pack_trajectories

TEN_MB = 10 * 1024 * 1024


class RaisingTool(Tool):
    name = "raising"
    description = "always raises"

    def execute(self, arguments: dict[str, Any]) -> str:
        raise RuntimeError("disk on fire")


class HangingTool(Tool):
    """A coroutine tool that never returns (cancelled by the environment's per-call timeout)."""

    name = "hanging"
    description = "never returns"
    timeout_s = 0.2

    async def execute(self, arguments: dict[str, Any]) -> str:  # type: ignore[override]
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class BlockingTool(Tool):
    """A synchronous tool stuck in its worker thread until `release` is set (a thread cannot be interrupted)."""

    name = "blocking"
    description = "blocks its thread"
    timeout_s = 0.2

    def __init__(self) -> None:
        self.release = threading.Event()

    def execute(self, arguments: dict[str, Any]) -> str:
        self.release.wait()
        return "late"


class HugeTool(Tool):
    name = "huge"
    description = "returns 10 MB"

    def execute(self, arguments: dict[str, Any]) -> str:
        return "x" * TEN_MB


class FaultyEnvironment(Environment):
    """Wraps a ToolEnvironment; raises in `step` or `close` for questions marked so, and counts `close` calls."""

    def __init__(self, inner: ToolEnvironment) -> None:
        self.inner = inner
        self.closed: dict[str, int] = {}

    async def reset(self, request: dict[str, Any]) -> Sample:
        return await self.inner.reset(request)

    async def step(self, sample: Sample) -> StepResult:
        if "[fault:env_step]" in sample.task["question"]:
            raise EnvStepError("environment exploded in step")
        return await self.inner.step(sample)

    async def close(self, sample: Sample) -> None:
        self.closed[sample.id] = self.closed.get(sample.id, 0) + 1
        await self.inner.close(sample)
        if "[fault:env_close]" in sample.task["question"]:
            raise RuntimeError("environment exploded in close")


def reward(task: dict[str, Any], messages: list[dict[str, str]]) -> float:
    question = task["question"]
    if "[fault:reward_raises]" in question:
        raise ValueError("reward exploded")
    if "[fault:reward_nan]" in question:
        return math.nan
    return 1.0 if int(task["id"]) % 3 else 0.25  # rewards differ within the group, so advantages are not all 0


FAULTS = [
    "[tool:raising]", "[tool:hanging]", "[tool:blocking]", "[tool:huge]", "[fault:env_step]", "[fault:env_close]",
    "[fault:engine_error]", "[fault:engine_hang]", "[fault:reward_raises]", "[fault:reward_nan]",
]  # fmt: skip


@pytest.fixture
def blocking_tool():
    tool = BlockingTool()
    yield tool
    tool.release.set()  # lets the abandoned worker thread end


def _tasks(markers: list[str]) -> list[dict[str, Any]]:
    return [{"id": i, "question": f"What is 12 * 7? {m}", "ground_truth": "84"} for i, m in enumerate(markers)]


async def _rollout(tokenizer, tasks, *, tools, n_parallel_agents=8, **config):
    renderer = ChatRenderer(tokenizer)
    env = FaultyEnvironment(ToolEnvironment(tools, tools_in_system_prompt=not renderer.supports_tools))
    engine = ScriptedEngine(tokenizer)
    harness = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=3072, turn_timeout_s=0.5,
                            **config)  # fmt: skip

    async def one(task, idx):
        return await run_trajectory(task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=harness, reward_fn=reward))  # fmt: skip

    trajectories = await run_tasks(tasks, one, n_parallel_agents=n_parallel_agents)
    return trajectories, env, engine


async def test_each_injected_fault_fails_or_reports_only_its_trajectory_and_close_runs_once(tokenizer, blocking_tool):
    markers = [m for fault in FAULTS for m in (fault, "")]  # every faulty task has a clean sibling after it
    tools = [CalculatorTool(), RaisingTool(), HangingTool(), blocking_tool, HugeTool()]
    trajs, env, engine = await _rollout(tokenizer, _tasks(markers), tools=tools, max_retries=1)
    by_marker = {m: t for m, t in zip(markers, trajs, strict=True) if m}

    # A tool that crashed or did not return within its bound failed, not the policy: the model read the error, the
    # trajectory was rolled out once more (the scripted engine writes the same call) and failed with kind "tool".
    for marker, expected in [("[tool:raising]", "Error: tool 'raising' failed: RuntimeError: disk on fire"),
                             ("[tool:hanging]", "Error: tool 'hanging' timed out after 0.2 s"),
                             ("[tool:blocking]", "Error: tool 'blocking' timed out after 0.2 s")]:  # fmt: skip
        t = by_marker[marker]
        assert t.failed and t.failure_kind == "tool", t.error
        assert t.error == "ToolUnavailableError: " + expected.removeprefix("Error: ")
        assert t.chat_completions[3] == {"role": "tool", "content": expected}
        assert t.metrics["tool_errors"] == 1 and t.metrics["retries_tool"] == 1
    huge = by_marker["[tool:huge]"]
    assert not huge.failed, huge.error
    observation = huge.chat_completions[3]["content"]
    cut = TEN_MB - MAX_OBSERVATION_CHARS
    assert observation == "x" * MAX_OBSERVATION_CHARS + f"\n...[truncated {cut} characters]"
    assert huge.response_masks.numel() < 4 * MAX_OBSERVATION_CHARS  # the 10 MB never reached the token record

    failed = {
        "[fault:env_step]": (TerminationReason.ERROR, "EnvStepError: environment exploded in step"),
        "[fault:env_close]": (TerminationReason.ERROR, "environment.close failed: RuntimeError: environment exploded"),
        "[fault:engine_error]": (TerminationReason.ERROR, "EngineError: request rejected by vLLM: injected fault"),
        "[fault:engine_hang]": (TerminationReason.TIMEOUT, "EngineTimeoutError: engine request did not return"),
        "[fault:reward_raises]": (TerminationReason.ERROR, "ValueError: reward exploded"),
        "[fault:reward_nan]": (TerminationReason.ERROR, "RewardError: reward function returned nan"),
    }
    kinds = {"[fault:engine_error]": "engine", "[fault:engine_hang]": "engine", "[fault:reward_raises]": "reward",
             "[fault:reward_nan]": "reward"}  # fmt: skip  (the environment's own failures are not retried)
    for marker, (reason, error) in failed.items():
        t = by_marker[marker]
        assert t.failed, marker
        assert (t.termination_reason, t.error[: len(error)]) == (reason, error)
        assert t.trajectory_reward == 0.0
        assert t.failure_kind == kinds.get(marker), marker
        assert t.metrics["retries"] == (marker in kinds), marker
    siblings = [t for m, t in zip(markers, trajs, strict=True) if not m]
    for t in siblings:
        assert not t.failed, t.error
        assert t.termination_reason == TerminationReason.ENV_DONE
        assert t.chat_completions[3] == {"role": "tool", "content": "84"}
        assert t.metrics["res_reward"] == reward(t.task, [])

    assert [t.idx for t in trajs] == list(range(len(markers)))
    retried = sum(t.metrics["retries"] for t in trajs)
    assert retried == 3 + len(kinds)  # every attempt has its own sample, closed once
    assert len(env.closed) == len(markers) + retried and set(env.closed.values()) == {1}
    assert engine.in_flight == 0  # the hung request was cancelled (a VLLMEngine aborts it)
    assert env.inner._sessions == {}

    # GRPO: failed rows are invalid, get advantage 0 and do not enter the group's mean or std.
    batch = pack_trajectories(trajs, pad_token_id=0, group_ids=[0] * len(trajs))
    is_failed = torch.tensor([t.failed for t in trajs])
    assert torch.equal(batch.valid, ~is_failed)
    assert float(batch.response_mask[is_failed].sum()) == 0.0
    advantages = group_advantages(batch.rewards, batch.group_ids, batch.valid)
    assert torch.equal(advantages[is_failed], torch.zeros(int(is_failed.sum())))
    valid_only = group_advantages(batch.rewards[~is_failed], batch.group_ids[~is_failed], batch.valid[~is_failed])
    assert torch.allclose(advantages[~is_failed], valid_only)
    assert float(advantages[~is_failed].abs().sum()) > 0


class HangingCloseEnvironment(FaultyEnvironment):
    async def close(self, sample: Sample) -> None:
        self.closed[sample.id] = self.closed.get(sample.id, 0) + 1
        await anyio.sleep_forever()


async def test_close_that_hangs_is_bounded_and_fails_only_its_trajectory(tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = HangingCloseEnvironment(ToolEnvironment([CalculatorTool()], tools_in_system_prompt=True))
    engine = ScriptedEngine(tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=1024, close_timeout_s=0.2)

    traj = await run_trajectory(
        _tasks([""])[0], 0, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
    )

    assert traj.failed and traj.termination_reason == TerminationReason.ERROR
    assert traj.error == "environment.close did not finish within close_timeout_s=0.2"
    assert list(env.closed.values()) == [1]


async def test_cancelled_rollout_with_faults_closes_every_started_trajectory_once(tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = FaultyEnvironment(ToolEnvironment([CalculatorTool(), HangingTool()], tools_in_system_prompt=True))
    engine = ScriptedEngine(tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=1024)  # default turn timeout
    tasks = _tasks(["[fault:engine_hang]", "[fault:engine_hang]", "", "[tool:hanging]"])

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    results: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def rollout() -> None:
            results.append(await run_tasks(tasks, one, n_parallel_agents=4))

        tg.start_soon(rollout)
        while engine.in_flight < 2:  # both hung requests are in the engine
            await anyio.sleep(0.01)
        tg.cancel_scope.cancel()

    assert results == []
    assert engine.in_flight == 0
    assert len(env.closed) == 4 and set(env.closed.values()) == {1}


class OutOfVocabEngine(DelegatingEngine):
    """Sends the real engine a prompt with an id outside the vocabulary for questions marked `[fault:bad_ids]`."""

    def __init__(self, inner: Any, tokenizer: Any) -> None:
        super().__init__(inner)
        self.tokenizer = tokenizer

    async def generate(self, prompt_ids, sampling):
        if "[fault:bad_ids]" in self.tokenizer.decode(list(prompt_ids)):
            prompt_ids = [*prompt_ids, 10**9]
        return await self.inner.generate(prompt_ids, sampling)


async def test_real_engine_rejecting_a_request_fails_only_that_trajectory(engine, tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = FaultyEnvironment(ToolEnvironment([CalculatorTool()], tools_in_system_prompt=True))
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=256,
                           sampling={"temperature": 0.0, "max_tokens": 8})  # fmt: skip
    faulty = OutOfVocabEngine(engine, tokenizer)

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=faulty, environment=env, renderer=renderer, config=config)
        )

    trajs = await run_tasks(_tasks(["", "[fault:bad_ids]", ""]), one, n_parallel_agents=3)

    assert [t.failed for t in trajs] == [False, True, False]
    assert trajs[1].termination_reason == TerminationReason.ERROR
    assert trajs[1].error.startswith("EngineRejectedError: request rejected by vLLM")
    assert all(t.num_generated_tokens > 0 for t in (trajs[0], trajs[2]))
    assert trajs[1].failure_kind == "engine" and trajs[1].metrics["retries_engine"] == 2  # the default max_retries
    assert set(env.closed.values()) == {1} and len(env.closed) == 5  # task 1: three attempts
    assert engine.in_flight_requests == 0


class _UserFeedbackEnvironment(ToolEnvironment):
    """Answers task 0 with a user message instead of the tool result."""

    async def step(self, sample: Sample) -> StepResult:
        if sample.task["id"] == 0 and sample.messages[-1]["role"] == "assistant":
            return StepResult([{"role": "user", "content": "Check it again."}], False, {})
        return await super().step(sample)


async def test_observation_the_template_cannot_append_exactly_fails_only_its_trajectory_when_refused(qwen3_tokenizer):
    renderer = ChatRenderer(qwen3_tokenizer)  # Qwen3: tool results append exactly, user messages do not
    env = _UserFeedbackEnvironment([CalculatorTool()], tools_in_system_prompt=False)
    engine = ScriptedEngine(qwen3_tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=2048, template_rewrites="refuse")

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    first, second = await run_tasks(_tasks(["", ""]), one, n_parallel_agents=2)
    assert first.failed and first.termination_reason == TerminationReason.ERROR
    assert "TemplateError" in first.error and "once a user message follows" in first.error
    assert not second.failed, second.error
    assert second.metrics["tool_calls"] == 1 and second.metrics["alignment_mismatches"] == 0


async def test_an_observation_the_template_cannot_append_starts_a_new_run_by_default(qwen3_tokenizer):
    """Qwen3 drops the `<think>` block of a turn once a user message follows it: the user's feedback starts a run
    prompted with the template's own render, and the trajectory goes on."""
    renderer = ChatRenderer(qwen3_tokenizer, history_rewrites=True)
    env = _UserFeedbackEnvironment([CalculatorTool()], tools_in_system_prompt=False)
    engine = ScriptedEngine(qwen3_tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=2048)
    spec = RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
    traj = await run_trajectory(_tasks([""])[0], 0, spec)

    assert not traj.failed, traj.error
    assert len(traj.runs) == len(traj.steps) == 3 and traj.metrics["template_runs"] == 2  # feedback after each turn
    assistant_at = [k for k, m in enumerate(traj.chat_completions) if m["role"] == "assistant"]
    for run, at in zip(traj.runs[1:], assistant_at[1:], strict=True):  # each run: the template's render so far
        history = traj.chat_completions[:at]
        assert renderer.decode(run.prompt_ids) == renderer.render(history, env.schemas, add_generation_prompt=True)
        assert history[-1] == {"role": "user", "content": "Check it again."}
