"""Failures outside the policy are rolled out again with a fresh sample (`HarnessConfig.max_retries`), counted by
kind, and never become a reward the policy is trained on; the policy's own failures are not retried.

Real tiny vLLM engine, real chat template, real tool environment. Each fault fails one call in N of a service (a
tool, the engine, the reward). The trajectories run one at a time (`n_parallel_agents=1`), so the calls follow each
other in a fixed order and a retry never lands on the next failing call: every trajectory ends well.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from support.engines import ForcedCallEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import EngineError, ToolUnavailableError
from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.rollout.summary import summarize
from agentic_rl.tools.calculator import CalculatorTool

N = 5
TASKS = 7


class EveryNth:
    """Counts calls across trajectories; `hit()` is True for calls N, 2N, ..."""

    def __init__(self, n: int) -> None:
        self.n, self.calls, self.failures = n, 0, 0
        self._lock = threading.Lock()

    def hit(self) -> bool:
        with self._lock:
            self.calls += 1
            failing = self.calls % self.n == 0
            self.failures += failing
            return failing


class FlakyCalculator(CalculatorTool):
    """The calculator behind a service that fails one call in N (a transport error)."""

    def __init__(self, counter: EveryNth) -> None:
        super().__init__()
        self.counter = counter

    def execute(self, arguments: dict[str, Any]) -> str:
        if self.counter.hit():
            raise ToolUnavailableError("calculator service: connection reset (injected)")
        return super().execute(arguments)


class FlakyEngine(ForcedCallEngine):
    """The real engine (first turn a forced calculator call), failing one request in N before it reaches vLLM."""

    def __init__(self, inner: Any, tokenizer: Any, counter: EveryNth | None) -> None:
        super().__init__(inner, tokenizer)
        self.counter = counter

    async def generate(self, prompt_ids, sampling):
        if self.counter is not None and self.counter.hit():
            raise EngineError("request failed in the engine (injected)")
        return await super().generate(prompt_ids, sampling)


def _tasks() -> list[dict[str, Any]]:
    return [{"id": i, "question": f"What is {i + 2} * 7? Use the calculator.", "ground_truth": str((i + 2) * 7)}
            for i in range(TASKS)]  # fmt: skip


@pytest.mark.parametrize("fault", ["tool", "engine", "reward"])
async def test_one_failure_in_n_is_retried_with_a_fresh_sample_and_every_trajectory_ends_well(engine, tokenizer, fault):
    counter = EveryNth(N)
    renderer = ChatRenderer(tokenizer)
    tool = FlakyCalculator(counter) if fault == "tool" else CalculatorTool()
    env = ToolEnvironment([tool], tools_in_system_prompt=not renderer.supports_tools)
    flaky = FlakyEngine(engine, tokenizer, counter if fault == "engine" else None)
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=512, reward_timeout_s=0.5,
                           sampling={"temperature": 1.0, "max_tokens": 64, "seed": 3})  # fmt: skip

    async def reward(task: dict[str, Any], messages: list[dict[str, str]]) -> float:
        if fault == "reward" and counter.hit():
            await anyio.sleep(30)  # an endpoint that never answers: cut at reward_timeout_s
        return 1.0 if task["ground_truth"] in str(messages[-1].get("content")) else 0.0

    spec = RolloutSpec(engine=flaky, environment=env, renderer=renderer, config=config, reward_fn=reward)

    async def one(task, idx):
        return await run_trajectory(task, idx, spec)

    trajs = await run_tasks(_tasks(), one, n_parallel_agents=1)

    assert counter.failures >= 1  # the fault did fire
    for t in trajs:
        assert not t.failed, t.error
        assert t.failure_kind is None and t.metrics["alignment_mismatches"] == 0
        assert ("retried_time_s" in t.metrics) == (t.metrics["retries"] > 0)
        assert t.metrics["retries"] == t.metrics.get(f"retries_{fault}", 0)  # only this kind was retried
    assert sum(t.metrics["retries"] for t in trajs) == counter.failures  # each failure retried once, counted by kind
    summary = summarize(trajs, 1.0)
    assert summary[f"retries_{fault}"] == counter.failures and summary["failed"] == 0
    assert all(summary[f"failed_{kind}"] == 0 for kind in ("engine", "tool", "environment", "reward"))

    # A retry samples afresh: each attempt's first request (one assistant header: the generation prompt) has a seed
    # of its own. (A request the engine failed never reached it, so it is not among the calls.)
    retried = [t for t in trajs if t.metrics["retries"]]
    assert retried
    for t in retried:
        question = t.chat_completions[1]["content"]
        seeds = [sampling.seed for prompt, sampling, _ in flaky.calls
                 if tokenizer.decode(prompt).count("<|im_start|>assistant") == 1 and question in tokenizer.decode(prompt)]  # fmt: skip
        assert len(set(seeds)) == len(seeds) >= (1 if fault == "engine" else 1 + t.metrics["retries"])


async def test_the_policys_own_failures_are_not_retried(engine, tokenizer):
    """A prompt that is too long is the task's doing: it fails once, with no kind, and is not retried."""
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    config = HarnessConfig(max_steps=2, max_prompt_length=64, max_response_length=64, max_retries=2,
                           sampling={"temperature": 1.0, "max_tokens": 8})  # fmt: skip
    spec = RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
    t = await run_trajectory({"id": 0, "question": "long " * 200, "ground_truth": "1"}, 0, spec)
    assert t.failed and t.termination_reason == "prompt_too_long"
    assert t.failure_kind is None and t.metrics["retries"] == 0


async def test_a_retried_failure_that_keeps_failing_ends_with_its_kind_after_max_retries(engine, tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    counter = EveryNth(1)  # every request fails
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=64, max_retries=3,
                           sampling={"temperature": 1.0, "max_tokens": 8})  # fmt: skip
    spec = RolloutSpec(engine=FlakyEngine(engine, tokenizer, counter), environment=env, renderer=renderer, config=config)
    t = await run_trajectory({"id": 0, "question": "What is 2 + 2?", "ground_truth": "4"}, 0, spec)
    assert t.failed and t.failure_kind == "engine" and t.trajectory_reward == 0.0
    assert t.metrics["retries"] == t.metrics["retries_engine"] == 3 and counter.calls == 4
    assert t.metrics["retried_time_s"] > 0 and t.metrics["retried_generated_tokens"] == 0  # no request got through
