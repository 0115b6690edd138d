"""One trajectory from start to end: reset, the turn loop (`rollout.turn_loop`), the reward, close, the record; and
again from the start, with a fresh sample, after a failure outside the policy (`rollout.retries`).

This is the single place per trajectory that turns an unexpected exception into a failed trajectory.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import anyio

from agentic_rl.chat import check_alignment
from agentic_rl.environments.base import Sample
from agentic_rl.errors import (
    AgenticRLError,
    EngineAbortedError,
    EngineTimeoutError,
    EnvStepError,
    EnvTimeoutError,
    TrajectoryError,
)
from agentic_rl.rewards.base import score_answer
from agentic_rl.rewards.shaping import TrajectoryFacts, TurnFacts
from agentic_rl.rollout.bounded import close_sample, env_call
from agentic_rl.rollout.retries import failure_kind, retry_counts
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.rollout.state import TrajectoryCheckpoint, TrajectoryState
from agentic_rl.rollout.turn_loop import turn_loop
from agentic_rl.types import FailureKind, StepTrajectory, TerminationReason, TokenRun

__all__ = [
    "HarnessConfig",
    "RewardCallable",
    "RolloutSpec",
    "TerminationReason",
    "TrajectoryCheckpoint",
    "run_trajectory",
]

logger = logging.getLogger(__name__)


async def run_trajectory(
    task: dict[str, Any],
    idx: int,
    spec: RolloutSpec,
    *,
    pause: anyio.Event | None = None,
    checkpoint: TrajectoryCheckpoint | None = None,
) -> StepTrajectory | TrajectoryCheckpoint:
    """Run one task to the end and record it token-exactly.

    Args:
        task: `{"id", "question", "ground_truth", ...}`.
        idx: the task's position in the batch (stored as `Trajectory.idx`, also offsets the sampling seed).
        spec: the engine, environment, renderer, limits and sampling, reward and memory (`RolloutSpec`). With
            memory, each turn is prompted with the memory's messages; when they differ from the running history
            (summarized, thinking dropped) a new exact run starts: the trajectory then has several `runs`, the
            top-level token fields hold the last one, and each step points into its own run.
        pause: when this event is set, the loop stops at the next turn boundary (a turn in flight, generation and
            environment step, always finishes first) and returns a `TrajectoryCheckpoint`, leaving the environment
            open. Without `pause` the result is always a `StepTrajectory`.
        checkpoint: continue a suspended trajectory from its next turn instead of starting `task` (`task` and
            `idx` are then taken from the checkpoint; pass the same spec).

    Returns:
        A `StepTrajectory`, or a `TrajectoryCheckpoint` if `pause` was set before the trajectory ended. An
        exception inside the loop does not propagate: it returns a trajectory with `failed=True`,
        `termination_reason="error"` (`"timeout"` for an engine request past `config.turn_timeout_s` or an
        `environment.reset` / `environment.step` past `config.env_timeout_s`, `"aborted"` for a turn the engine
        aborted) and the error message; a failing or hanging `environment.close` also fails the trajectory. A
        failure outside the policy (`rollout.retries.failure_kind`) is rolled out again from the start, with a
        fresh sample, up to `config.max_retries` times (the environment closed and reset in between); the result
        counts the retries by kind in its metrics (`retries`, `retries_<kind>`; the failed attempts' seconds and
        sampled tokens in `retried_time_s`, `retried_generated_tokens`, which the other times and counts, of the
        last attempt, leave out) and, if it still failed, names the kind in `failure_kind`.
        Cancellation still propagates after `environment.close` ran (once).
    """
    state = checkpoint._state if checkpoint is not None else TrajectoryState(task, idx)
    while True:
        result = await _attempt(spec, state, pause, resumed=checkpoint is not None)
        checkpoint = None
        if isinstance(result, TrajectoryCheckpoint) or not _retry(spec, state, result):
            return result
        state = TrajectoryState(
            state.task,
            state.idx,
            attempt=state.attempt + 1,
            retries=state.retries,
            retried_s=state.retried_s + float(result.metrics["total_time"]),
            retried_tokens=state.retried_tokens + result.num_generated_tokens,
        )


def _retry(spec: RolloutSpec, state: TrajectoryState, result: StepTrajectory) -> bool:
    """Whether `result` (attempt `state.attempt`) is rolled out again: it failed outside the policy and retries are
    left. Counts the retry by kind in `state.retries`."""
    kind = result.failure_kind
    if kind is None or state.attempt >= spec.config.max_retries:
        return False
    state.retries[kind] = state.retries.get(kind, 0) + 1
    logger.warning(
        "trajectory %s (task %r): %s failure, retry %d/%d with a fresh sample",
        state.idx,
        state.task.get("id"),
        kind,
        state.attempt + 1,
        spec.config.max_retries,
    )
    return True


async def _attempt(
    spec: RolloutSpec, state: TrajectoryState, pause: anyio.Event | None, *, resumed: bool
) -> StepTrajectory | TrajectoryCheckpoint:
    """One attempt of `run_trajectory`: reset (unless `resumed`), the turns, the reward, close."""
    started = time.perf_counter() - state.elapsed_s
    reason: TerminationReason | None = TerminationReason.ERROR
    error: str | None = None
    kind: FailureKind | None = None
    reward = 0.0
    rewarding = False
    try:
        if not resumed:
            await _reset(spec, state)
        reason = await turn_loop(spec, state, pause)
        if reason is None:
            state.elapsed_s = time.perf_counter() - started
            return TrajectoryCheckpoint(state)
        if reason == TerminationReason.PROMPT_TOO_LONG:
            error = state.metrics["limit"]
        else:
            rewarding = True
            reward = await _reward(spec, state)
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        reason, error, reward = _failure(exc, state), f"{type(exc).__name__}: {exc}", 0.0
        kind = failure_kind(exc, rewarding=rewarding)
    finally:
        if state.sample is not None and reason is not None:
            t0 = time.perf_counter()
            close_error = await close_sample(spec.environment, state.sample, state.idx, spec.config.close_timeout_s)
            state.metrics["env_time"] += time.perf_counter() - t0
            if close_error is not None and error is None:
                reason, error, reward = TerminationReason.ERROR, close_error, 0.0
    return _finish(spec, state, reason, error, reward, time.perf_counter() - started, kind)


async def _reset(spec: RolloutSpec, state: TrajectoryState) -> None:
    """`environment.reset` (bounded by `env_timeout_s`), then the memory of a new trajectory."""
    state.milestones = spec.config.shaping().milestones(state.task)  # a malformed list fails it before it starts
    t0 = time.perf_counter()
    retry = f"-retry{state.attempt}" if state.attempt else ""  # each attempt's own tool sessions
    request = {**state.task, "trajectory_id": f"{state.task.get('id', state.idx)}-{state.idx}{retry}"}
    state.sample = await env_call(spec.environment, "reset", request, spec.config.env_timeout_s)
    if not isinstance(state.sample, Sample):
        sample, state.sample = state.sample, None  # nothing to close
        raise EnvStepError(f"reset() must return a Sample, got {type(sample).__name__}")
    state.metrics["env_time"] += time.perf_counter() - t0
    if spec.memory_factory is not None:
        state.memory = spec.memory_factory()
        for message in state.sample.messages:
            state.memory.add_message(message)


async def _reward(spec: RolloutSpec, state: TrajectoryState) -> float:
    """The final answer's reward, 0 without a reward function (`score_answer`: bounded by `config.reward_timeout_s`;
    its time, its failure and the metrics of a `RewardWithMetrics` noted in the trajectory's metrics).

    Raises:
        RewardError: past the bound, or if the reward is not a finite number; else what the reward raised.
    """
    if spec.reward_fn is None:
        return 0.0
    assert state.sample is not None
    messages = list(state.sample.messages)
    return await score_answer(
        spec.reward_fn, state.sample.task, messages, timeout_s=spec.config.reward_timeout_s, metrics=state.metrics
    )


def _failure(exc: Exception, state: TrajectoryState) -> TerminationReason:
    """Log a trajectory's failure once and name its termination reason."""
    if isinstance(exc, AgenticRLError):  # an expected kind of failure: its message says it all
        logger.error("trajectory %s (task %r) failed: %s: %s", state.idx, state.task.get("id"), type(exc).__name__, exc)
    else:
        logger.exception("trajectory %s (task %r) failed", state.idx, state.task.get("id"))
    if isinstance(exc, (EngineTimeoutError, EnvTimeoutError)):
        return TerminationReason.TIMEOUT
    if isinstance(exc, EngineAbortedError):
        return TerminationReason.ABORTED
    return TerminationReason.ERROR


def _finish(
    spec: RolloutSpec,
    state: TrajectoryState,
    reason: TerminationReason,
    error: str | None,
    reward: float,
    total_s: float,
    kind: FailureKind | None = None,
) -> StepTrajectory:
    """The finished trajectory: rewards, the alignment check, and the record (a failed one if it is invalid; `kind`
    names a failure outside the policy).

    `trajectory_reward` and each `Step.reward` are what the run's shaping (`HarnessConfig.shaping`, see
    `rewards.shaping`) makes of the trajectory's facts."""
    metrics, config = state.metrics, spec.config
    failed = error is not None
    facts = TrajectoryFacts(
        turns=[state.turn_facts.get(k, TurnFacts()) for k in range(len(state.steps))],
        answer_reward=reward,
        failed=failed,
        cut_by_limit=reason.cut_by_limit,
        tool_calls=metrics["tool_calls"],
        well_formed_calls=metrics["well_formed_calls"],
        milestones=state.milestones,
    )
    shaping = config.shaping()
    shaped = shaping.score(facts)
    if not failed and config.check_alignment and state.recorder.runs:
        _check_alignment(spec, state)
    metrics.update(
        steps=len(state.steps),
        res_reward=reward,
        toolcall_reward=shaped.metrics["toolcall_reward"],
        total_time=total_s,
        generated_tokens=sum(run.num_sampled for run in state.recorder.runs),
        **retry_counts(state.retries),
    )
    if state.retries:  # the failed attempts' work, which the times and token counts above leave out
        metrics.update(retried_time_s=state.retried_s, retried_generated_tokens=state.retried_tokens)
    if state.steps:
        state.steps[-1].done = True
    messages = list(state.sample.messages) if state.sample is not None else []
    runs = state.recorder.runs or [TokenRun([])]
    task = _rewarded_task(state)
    common = {"idx": state.idx, "chat_completions": messages, "metrics": metrics, "task": task, "steps": state.steps}
    try:
        trajectory = StepTrajectory.from_runs(
            runs,
            trajectory_reward=shaped.trajectory_reward,
            termination_reason=reason,
            failed=failed,
            error=error,
            failure_kind=kind if failed else None,
            **common,
        )
        shaped.credit(state.steps)
        trajectory.credited = True
        trajectory.metrics.update({k: v for k, v in shaped.metrics.items() if k not in metrics})
        return trajectory
    except TrajectoryError as exc:  # e.g. the engine reported a NaN logprob: this trajectory fails, not the batch
        logger.error("trajectory %s (task %r) failed: invalid record: %s", state.idx, state.task.get("id"), exc)
        for run in runs:  # in place: the steps keep pointing at the trajectory's runs
            run.response_logprobs = None
        shaping.score(dataclasses.replace(facts, answer_reward=0.0, failed=True)).credit(state.steps)
        return StepTrajectory.from_runs(
            runs,
            termination_reason=TerminationReason.ERROR,
            failed=True,
            error=f"TrajectoryError: {exc}",
            failure_kind=FailureKind.ENGINE,
            **common,
        )


def _rewarded_task(state: TrajectoryState) -> dict[str, Any]:
    """The task as `environment.reset` augmented (or replaced) it, which the reward read; without the
    `trajectory_id` the harness added to the request."""
    if state.sample is None or not isinstance(state.sample.task, dict):
        return state.task
    added = "trajectory_id" not in state.task
    return {k: v for k, v in state.sample.task.items() if not (added and k == "trajectory_id")}


def _check_alignment(spec: RolloutSpec, state: TrajectoryState) -> None:
    """Compare the current run with a full re-render of its messages (metrics `alignment_mismatches`,
    `retokenize_drift`)."""
    tools = state.sample.tools if state.sample is not None else None
    report = check_alignment(spec.renderer, state.messages, state.segments, tools)
    state.metrics["alignment_mismatches"] = report.mismatches
    state.metrics["retokenize_drift"] = report.retokenize_drift
    if report.mismatches:
        logger.warning("trajectory %s: %d token alignment mismatches (%s)", state.idx, report.mismatches, report.detail)
