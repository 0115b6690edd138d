"""`Rollout.aclose` at the end of a run: shielded, bounded by `close_timeout_s`, a failure or a hang logged as a
warning naming the environment's class, never raised."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import pytest

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec


class ClosingEnvironment(Environment):
    """An environment whose `aclose` hangs (waits for an event never set), raises, or returns after a pause."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.closed = False

    async def reset(self, request: dict[str, Any]) -> Sample:
        return Sample(id=request["trajectory_id"], task=request, messages=[{"role": "user", "content": "hi"}])

    async def step(self, sample: Sample) -> StepResult:
        return StepResult([], True, {})

    async def aclose(self) -> None:
        if self.mode == "hang":
            await anyio.Event().wait()
        if self.mode == "raise":
            raise RuntimeError("pool already gone")
        await anyio.sleep(0.2)
        self.closed = True


def _rollout(engine: Any, tokenizer: Any, mode: str) -> tuple[Rollout, ClosingEnvironment]:
    env = ClosingEnvironment(mode)
    spec = RolloutSpec(engine, env, ChatRenderer(tokenizer), HarnessConfig(close_timeout_s=0.5))
    return Rollout(spec, n_parallel_agents=1), env


@pytest.mark.parametrize(("mode", "message"), [("hang", "did not finish within 0.5 s"), ("raise", "pool already gone")])
async def test_an_aclose_that_hangs_or_raises_returns_within_the_bound_and_logs_a_warning(
    engine, tokenizer, caplog, mode, message
):
    rollout, _ = _rollout(engine, tokenizer, mode)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), anyio.fail_after(60):  # far beyond the bound: only a hang reaches it
        await rollout.aclose()  # never raises
    assert time.monotonic() - started < 30
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "ClosingEnvironment.aclose" in r.message]
    assert len(warnings) == 1 and message in warnings[0].message


async def test_aclose_runs_to_its_end_even_when_the_caller_is_cancelled(engine, tokenizer, caplog):
    rollout, env = _rollout(engine, tokenizer, "slow")
    with anyio.CancelScope() as scope:
        scope.cancel()  # e.g. the run is being torn down
        await rollout.aclose()
    assert env.closed
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
