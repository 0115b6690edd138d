"""A rollout warns once when something blocks its event loop (an `async def step` calling `time.sleep`), naming the
environment and the fix; a well-behaved environment gives no warning (real engine, real harness)."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from support.engines import SteeredEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec


class SleepyEnvironment(Environment):
    """Ends each trajectory at its first step; with `block_s`, that step blocks the loop with `time.sleep`."""

    def __init__(self, block_s: float = 0.0) -> None:
        self.block_s = block_s
        self.steps = 0

    async def reset(self, request: dict[str, Any]) -> Sample:
        messages = [{"role": "user", "content": request["question"]}]
        return Sample(id=request["trajectory_id"], task=request, messages=messages)

    async def step(self, sample: Sample) -> StepResult:
        self.steps += 1
        if self.block_s:
            time.sleep(self.block_s)  # the mistake the rollout warns about
        return StepResult([], True, {})


def _lag_warnings(caplog: Any) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "event loop was blocked" in r.message]


async def _run(engine: Any, tokenizer: Any, env: SleepyEnvironment) -> None:
    short = SteeredEngine(engine, tokenizer, lambda turn: {"regex": "Hello\\."})  # a closed turn, so its step runs
    config = HarnessConfig(max_steps=2, max_response_length=64, sampling={"temperature": 0.0, "max_tokens": 16})
    spec = RolloutSpec(short, env, ChatRenderer(tokenizer), config)
    tasks = [{"id": i, "question": "Say hello to me.", "ground_truth": "hello"} for i in range(2)]
    with anyio.fail_after(300):
        result = await Rollout(spec, n_parallel_agents=2).run(tasks)
    assert [t.failed for t in result.trajectories] == [False, False], [t.error for t in result.trajectories]


async def test_a_step_that_blocks_the_loop_is_warned_about_once_naming_the_environment(engine, tokenizer, caplog):
    env = SleepyEnvironment(block_s=2.0)
    with caplog.at_level(logging.WARNING):
        await _run(engine, tokenizer, env)

    assert env.steps == 2  # the loop was blocked twice, for 2 s each
    (warning,) = _lag_warnings(caplog)
    assert warning.levelno == logging.WARNING
    assert "SleepyEnvironment" in warning.message and "anyio.to_thread.run_sync" in warning.message
    with caplog.at_level(logging.WARNING):  # a training run's next batch: once per environment and process
        await _run(engine, tokenizer, env)
    assert env.steps == 4 and len(_lag_warnings(caplog)) == 1


class PoliteEnvironment(SleepyEnvironment):
    """Never blocks (a class of its own: warnings are once per environment class)."""


async def test_a_well_behaved_environment_gives_no_warning(engine, tokenizer, caplog):
    env = PoliteEnvironment()
    with caplog.at_level(logging.WARNING):
        await _run(engine, tokenizer, env)
    assert env.steps == 2 and not _lag_warnings(caplog)


async def test_a_block_right_before_the_watch_is_cancelled_is_still_warned_about(caplog):
    """The last trajectory may end just after a blocking call, so that the watch is cancelled before its sleep
    returns: the lag it slept through is still measured and warned about."""
    from agentic_rl.rollout.loop_lag import watch_loop_lag

    with caplog.at_level(logging.WARNING):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: watch_loop_lag("BlockedThenCancelled", interval_s=0.05, threshold_s=0.2))
            for _ in range(3):
                await anyio.sleep(0)  # the watch has started its sleep
            time.sleep(0.5)  # blocks the loop
            tg.cancel_scope.cancel()  # before the loop runs again: the watch's sleep ends cancelled
    (warning,) = _lag_warnings(caplog)
    assert "BlockedThenCancelled" in warning.message
