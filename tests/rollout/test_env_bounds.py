"""Every environment call of a rollout is bounded: a `reset` or `step` that never returns fails its own trajectory
with termination reason `timeout` naming the call, while its siblings finish (real engine, real harness), and the
bound `env_timeout_s` is settable from each entry point."""

from __future__ import annotations

from typing import Any

import anyio
from support.engines import SteeredEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec
from agentic_rl.types import TerminationReason


class StuckEnvironment(Environment):
    """`reset` of a question holding `[hang-reset]` and `step` of one holding `[hang-step]` wait for an event that is
    never set; every other trajectory ends after its first step. Records each closed sample's id."""

    def __init__(self) -> None:
        self.never = anyio.Event()
        self.closed: list[str] = []

    async def reset(self, request: dict[str, Any]) -> Sample:
        if "[hang-reset]" in request["question"]:
            await self.never.wait()
        messages = [{"role": "user", "content": request["question"]}]
        return Sample(id=request["trajectory_id"], task=request, messages=messages)

    async def step(self, sample: Sample) -> StepResult:
        if "[hang-step]" in sample.task["question"]:
            await self.never.wait()
        return StepResult([], True, {})

    async def close(self, sample: Sample) -> None:
        self.closed.append(sample.id)


async def test_a_hanging_reset_or_step_fails_its_trajectory_with_timeout_and_the_siblings_finish(engine, tokenizer):
    env = StuckEnvironment()
    config = HarnessConfig(max_steps=2, max_response_length=64, sampling={"temperature": 0.0, "max_tokens": 8},
                           env_timeout_s=1.0, max_retries=1)  # fmt: skip
    short = SteeredEngine(engine, tokenizer, lambda turn: {"regex": "Hi\\."})  # a closed turn, so its step runs
    spec = RolloutSpec(engine=short, environment=env, renderer=ChatRenderer(tokenizer), config=config)
    tasks = [
        {"id": "reset", "question": "Say hi. [hang-reset]", "ground_truth": "hi"},
        {"id": "step", "question": "Say hi. [hang-step]", "ground_truth": "hi"},
        {"id": "fine", "question": "Say hi.", "ground_truth": "hi"},
    ]
    with anyio.fail_after(300):  # far beyond the bound: only a hang would reach it
        result = await Rollout(spec, n_parallel_agents=3).run(tasks)
    by_id = {t.task["id"]: t for t in result.trajectories}

    hung_reset = by_id["reset"]
    assert hung_reset.failed and hung_reset.termination_reason == TerminationReason.TIMEOUT
    assert "environment.reset did not return within env_timeout_s=1" in hung_reset.error
    assert "EnvTimeoutError" in hung_reset.error and not hung_reset.steps
    hung_step = by_id["step"]
    assert hung_step.failed and hung_step.termination_reason == TerminationReason.TIMEOUT
    assert "environment.step did not return within env_timeout_s=1" in hung_step.error
    assert len(hung_step.steps) == 1  # the turn was generated; its step was cancelled
    fine = by_id["fine"]
    assert not fine.failed and fine.termination_reason == TerminationReason.ENV_DONE, fine.error
    # An environment call past its bound is an infrastructure failure: retried once (with a sample id of its own),
    # then failed with its kind. A reset that never returned left nothing to close; the others were closed once each.
    assert hung_reset.failure_kind == hung_step.failure_kind == "environment" and fine.failure_kind is None
    assert hung_reset.metrics["retries_environment"] == hung_step.metrics["retries_environment"] == 1
    assert sorted(env.closed) == ["fine-2", "step-1", "step-1-retry1"]


def test_env_timeout_s_reaches_the_harness_from_the_training_config_the_command_line_and_the_wrapper(tokenizer):
    from agentic_rl.cli.command import _parser
    from agentic_rl.cli.rollout import _harness_config
    from agentic_rl.loop import TrainConfig
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    assert HarnessConfig().env_timeout_s == 600.0
    assert TrainConfig().rollout.harness_config().env_timeout_s == 600.0
    assert TrainConfig(rollout={"env_timeout_s": 7.5}).rollout.harness_config().env_timeout_s == 7.5
    assert _harness_config(_parser().parse_args(["rollout", "--env-timeout-s", "9"])).env_timeout_s == 9.0
    assert _harness_config(_parser().parse_args(["rollout"])).env_timeout_s == 600.0
    wrapper = ToolAgentEngineWrapper("agent", tokenizer, model="unused", env_timeout_s=11.0)
    assert wrapper.harness_config.env_timeout_s == 11.0
