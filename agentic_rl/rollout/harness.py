"""One trajectory's turn loop: reset, then generate -> environment step -> observe, until a stop condition.

This is the single place per trajectory that turns an unexpected exception into a failed trajectory.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from pydantic import ConfigDict, Field

from agentic_rl.chat import ChatRenderer, Segment, check_alignment
from agentic_rl.config import Config
from agentic_rl.engine.base import Engine, Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import ABORTED, CUT, read_turn
from agentic_rl.environments.base import Environment, Sample
from agentic_rl.errors import AgenticRLError, EngineAbortedError, EngineTimeoutError, RewardError, TrajectoryError
from agentic_rl.memory import MemorySimple, MemorySummary, to_template_messages
from agentic_rl.parser import TOOL_CALL_OPEN, split_thought
from agentic_rl.types import Step, StepTrajectory

__all__ = ["HarnessConfig", "TerminationReason", "TrajectoryCheckpoint", "run_trajectory"]

logger = logging.getLogger(__name__)


class TerminationReason:
    """Why a turn loop stopped (the `termination_reason` of a trajectory)."""

    ENV_DONE = "env_done"  # the environment ended it (e.g. a final answer without a tool call)
    MAX_STEPS = "max_steps"  # `max_steps` turns used and the environment still wanted more
    TRUNCATED = "truncated"  # a turn hit the per-turn `max_tokens`; its half-written tool call is not run
    CONTEXT_LIMIT = "context_limit"  # no room left in the model window or the response budget
    PROMPT_TOO_LONG = "prompt_too_long"  # the first prompt exceeds `max_prompt_length` or fills the window (failed)
    INVALID_TASK = "invalid_task"  # the task could not be read (failed)
    ERROR = "error"  # an exception in the engine, environment or reward, or a failing close (failed)
    TIMEOUT = "timeout"  # an engine request did not return within `turn_timeout_s`; it was aborted (failed)
    ABORTED = "aborted"  # the engine ended a turn as aborted (finish_reason `abort`, `error`); never trained (failed)


class HarnessConfig(Config):
    """Limits and sampling of a rollout.

    Attributes:
        max_steps: most assistant turns per trajectory.
        max_prompt_length: most tokens of the first prompt.
        max_response_length: most tokens after the first prompt (sampled + inserted), the response budget.
        sampling: the `SamplingConfig` of every turn (a dict of its options is accepted). `max_tokens`, if given,
            caps each turn; it is always clamped to what is left of the window and of the response budget. A `seed`
            is offset per trajectory and turn so that samples of one group differ. Seeded runs repeat exactly only
            with the same batch composition (`n_parallel_agents`, task order): the engine's numerics depend on the batch.
            Stop strings and further `stop_token_ids` end a turn as complete (see `agentic_rl.engine.turns`).
        toolcall_weight: `toolcall_reward = toolcall_weight * well-formed calls / attempted calls` (0 without calls).
        check_alignment: compare each finished trajectory's ids with a full template re-render (metrics
            `alignment_mismatches`, `retokenize_drift`).
        turn_timeout_s: most seconds one `engine.generate` call may take; past it the request is aborted and the
            trajectory fails with `termination_reason="timeout"`. The default (1 hour) only catches requests that
            never return; lower it when turns are short.
        close_timeout_s: most seconds `environment.close` may take (it runs shielded from cancellation); past it
            the trajectory fails and the environment may have leaked resources.

    Raises:
        ConfigError: naming the first field that is out of range or of the wrong type.
    """

    model_config = ConfigDict(strict=True)

    max_steps: Annotated[int, Field(ge=1)] = 5
    max_prompt_length: Annotated[int, Field(ge=1)] = 128 * 1024
    max_response_length: Annotated[int, Field(ge=1)] = 8 * 1024
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    toolcall_weight: Annotated[float, Field(allow_inf_nan=False)] = 0.1
    check_alignment: bool = True
    turn_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 3600.0
    close_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 30.0


RewardCallable = Callable[[dict[str, Any], Sequence[dict[str, str]]], float]


class _Record:
    """Growing token record of one continuous run of a trajectory, and the messages that run renders."""

    def __init__(self, prompt_ids: list[int], messages: list[dict[str, str]] | None = None) -> None:
        self.restart(prompt_ids, messages or [])

    def restart(self, prompt_ids: list[int], messages: list[dict[str, str]]) -> None:
        """Begin a new run (the first, or after memory rewrote the history)."""
        self.prompt_ids = prompt_ids
        self.messages = messages
        self.response_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.segments: list[Segment] = [Segment(tuple(prompt_ids), sampled=False)]

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self.response_ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.segments.append(Segment(tuple(ids), sampled=True))

    def add_inserted(self, ids: Sequence[int]) -> None:
        self.response_ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.segments.append(Segment(tuple(ids), sampled=False))

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(slots=True)
class _Cursor:
    """Where the turn loop stands: the next turn, what the model saw last, and whether the first prompt is built."""

    turn: int = 0
    observation: Any = None
    started: bool = False


@dataclass(slots=True)
class TrajectoryCheckpoint:
    """An unfinished trajectory stopped at a turn boundary (before a generation), ready to be resumed.

    The environment is **not** closed: `sample` is the live handle of its per-trajectory state (tool sessions,
    sandbox processes stay open), so a checkpoint can be resumed only in the same process, with the same
    environment object; `Rollout.discard` closes the environments of checkpoints that will not be resumed.
    Resuming continues with turn `turn` on exactly the recorded token ids (nothing is re-rendered or re-sampled).

    Attributes:
        task: the validated task.
        idx: the task's position in the batch (also offsets the sampling seed).
        sample: the environment's live state of this trajectory.
        turn: index of the next turn to generate (0 = suspended after `reset`, before any generation).
        steps: the `Step` of each turn generated so far; `steps[i].info["weight_version"]` is the engine weight
            version that sampled turn i.
        metrics: the trajectory's metrics so far (times, tool-call counts).
        elapsed_s: wall-clock seconds the trajectory ran before it was suspended.
    """

    task: dict[str, Any]
    idx: int
    sample: Sample
    turn: int
    steps: list[Step]
    metrics: dict[str, Any]
    elapsed_s: float
    _record: _Record
    _cursor: _Cursor
    _memory: MemorySimple | None

    @property
    def prompt_ids(self) -> list[int]:
        """The first prompt of the current exact run (token ids)."""
        return list(self._record.prompt_ids)

    @property
    def response_ids(self) -> list[int]:
        """Everything after `prompt_ids` so far: sampled and inserted token ids."""
        return list(self._record.response_ids)

    @property
    def weight_versions(self) -> list[int]:
        """The engine weight version of each generated turn, in order."""
        return [int(step.info.get("weight_version", 0)) for step in self.steps]


def _turn_sampling(config: HarnessConfig, renderer: ChatRenderer, idx: int, turn: int, room: int) -> SamplingConfig:
    base = config.sampling
    stop_ids = list(base.stop_token_ids or [])
    if renderer.end_of_turn_id not in stop_ids:
        stop_ids.append(renderer.end_of_turn_id)
    update: dict[str, Any] = {
        "max_tokens": room if base.max_tokens is None else min(base.max_tokens, room),
        "stop_token_ids": stop_ids,
    }
    if base.seed is not None:
        update["seed"] = (base.seed + 1_000_003 * idx + 7_919 * turn) % (2**31 - 1)
    return base.model_copy(update=update)


async def run_trajectory(
    task: dict[str, Any],
    idx: int,
    *,
    engine: Engine,
    environment: Environment,
    renderer: ChatRenderer,
    config: HarnessConfig,
    reward_fn: RewardCallable | None = None,
    memory_factory: Callable[[], MemorySimple] | None = None,
    pause: anyio.Event | None = None,
    checkpoint: TrajectoryCheckpoint | None = None,
) -> StepTrajectory | TrajectoryCheckpoint:
    """Run one task to the end and record it token-exactly.

    Args:
        task: `{"id", "question", "ground_truth", ...}`.
        idx: the task's position in the batch (stored as `Trajectory.idx`, also offsets the sampling seed).
        engine: token-in/token-out engine.
        environment: decides what each assistant turn leads to, and when the trajectory is done.
        renderer: the chat template of the engine's model.
        config: limits and sampling.
        reward_fn: `reward_fn(task, messages) -> float` for the final answer, run in a worker thread.
        memory_factory: builds a fresh memory per trajectory (`MemorySimple`/`MemorySummary`). Each turn is then
            prompted with the memory's messages; when they differ from the running history (summarized, thinking
            dropped) a new exact run starts, `metrics["continuous"]` becomes False, the top-level token fields hold
            the last run, and every step keeps its own `prompt_ids` / `response_ids` / `response_logprobs`.
        pause: when this event is set, the loop stops at the next turn boundary (a turn in flight, generation and
            environment step, always finishes first) and returns a `TrajectoryCheckpoint`, leaving the environment
            open. Without `pause` the result is always a `StepTrajectory`.
        checkpoint: continue a suspended trajectory from its next turn instead of starting `task` (`task` and
            `idx` are then taken from the checkpoint; pass the same engine, environment, renderer and config).

    Returns:
        A `StepTrajectory`, or a `TrajectoryCheckpoint` if `pause` was set before the trajectory ended. An
        exception inside the loop does not propagate: it returns a trajectory with `failed=True`,
        `termination_reason="error"` (`"timeout"` for an engine request past `config.turn_timeout_s`) and the error
        message; a failing or hanging `environment.close` also fails the trajectory. Cancellation still propagates
        after `environment.close` ran (once).
    """
    started = time.perf_counter()
    metrics: dict[str, Any] = {
        "llm_time": 0.0, "env_time": 0.0, "reward_time": 0.0, "tool_calls": 0, "tool_errors": 0,
        "well_formed_calls": 0, "generated_tokens": 0, "continuous": True,
    }  # fmt: skip
    steps: list[Step] = []
    record = _Record([])
    sample: Sample | None = None
    memory: MemorySimple | None = None
    cursor = _Cursor()
    if checkpoint is not None:
        task, idx, sample, steps, metrics = (
            checkpoint.task,
            checkpoint.idx,
            checkpoint.sample,
            checkpoint.steps,
            checkpoint.metrics,
        )
        record, cursor, memory = checkpoint._record, checkpoint._cursor, checkpoint._memory
        started -= checkpoint.elapsed_s
    reason = TerminationReason.ERROR
    error: str | None = None
    res_reward = 0.0
    try:
        if checkpoint is None:
            t0 = time.perf_counter()
            sample = await environment.reset({**task, "trajectory_id": f"{task.get('id', idx)}-{idx}"})
            metrics["env_time"] += time.perf_counter() - t0
            if memory_factory is not None:
                memory = memory_factory()
                for message in sample.messages:
                    memory.add_message(message)
        reason = await _turn_loop(
            sample, idx, engine, environment, renderer, config, record, steps, metrics, memory, cursor, pause
        )
        if reason == _SUSPENDED:
            return TrajectoryCheckpoint(task, idx, sample, cursor.turn, steps, metrics,
                                        time.perf_counter() - started, record, cursor, memory)  # fmt: skip
        if reason == TerminationReason.PROMPT_TOO_LONG:
            error = metrics["limit"]
        elif reward_fn is not None:
            t0 = time.perf_counter()
            res_reward = float(await anyio.to_thread.run_sync(reward_fn, sample.task, list(sample.messages)))
            metrics["reward_time"] = time.perf_counter() - t0
            if not math.isfinite(res_reward):
                raise RewardError(f"reward function returned {res_reward}")
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        if isinstance(exc, AgenticRLError):  # an expected kind of failure: its message says it all
            logger.error("trajectory %s (task %r) failed: %s: %s", idx, task.get("id"), type(exc).__name__, exc)
        else:
            logger.exception("trajectory %s (task %r) failed", idx, task.get("id"))
        reason, error = TerminationReason.ERROR, f"{type(exc).__name__}: {exc}"
        if isinstance(exc, EngineTimeoutError):
            reason = TerminationReason.TIMEOUT
        elif isinstance(exc, EngineAbortedError):
            reason = TerminationReason.ABORTED
        res_reward = 0.0
    finally:
        if sample is not None and reason != _SUSPENDED:
            close_error = await _close_environment(environment, sample, idx, config.close_timeout_s, metrics)
            if close_error is not None and error is None:
                reason, error, res_reward = TerminationReason.ERROR, close_error, 0.0

    messages = list(sample.messages) if sample is not None else []
    attempted = metrics["tool_calls"]
    toolcall_reward = config.toolcall_weight * metrics["well_formed_calls"] / attempted if attempted else 0.0
    failed = error is not None
    if failed:
        toolcall_reward = 0.0
    elif config.check_alignment and record.prompt_ids:
        report = check_alignment(renderer, record.messages, record.segments, sample.tools if sample else None)
        metrics["alignment_mismatches"] = report.mismatches
        metrics["retokenize_drift"] = report.retokenize_drift
        if report.mismatches:
            logger.warning("trajectory %s: %d token alignment mismatches (%s)", idx, report.mismatches, report.detail)
    metrics.update(
        steps=len(steps),
        res_reward=res_reward,
        toolcall_reward=toolcall_reward,
        total_time=time.perf_counter() - started,
    )
    if steps:
        steps[-1].done = True
        steps[-1].reward = res_reward + toolcall_reward
    try:
        return StepTrajectory(
            prompt_tokens=record.prompt_ids,
            response_tokens=record.response_ids,
            response_masks=record.mask,
            idx=idx,
            trajectory_reward=res_reward + toolcall_reward,
            chat_completions=messages,
            metrics=metrics,
            response_logprobs=record.logprobs,
            termination_reason=reason,
            failed=failed,
            error=error,
            task=task,
            steps=steps,
        )
    except TrajectoryError as exc:  # e.g. the engine reported a NaN logprob: this trajectory fails, not the batch
        logger.error("trajectory %s (task %r) failed: invalid record: %s", idx, task.get("id"), exc)
        return StepTrajectory(
            prompt_tokens=[], response_tokens=[], response_masks=[], idx=idx, chat_completions=messages,
            metrics=metrics, termination_reason=TerminationReason.ERROR, failed=True,
            error=f"TrajectoryError: {exc}", task=task, steps=steps,
        )  # fmt: skip


_SUSPENDED = "suspended"  # internal: the loop stopped at a turn boundary because `pause` was set


async def _close_environment(
    environment: Environment, sample: Sample, idx: int, timeout_s: float, metrics: dict[str, Any]
) -> str | None:
    """Close once, shielded from cancellation and bounded by `timeout_s`; returns the failure, if any."""
    error = None
    t0 = time.perf_counter()
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s) as scope:
        try:
            await environment.close(sample)
        except Exception as exc:
            logger.exception("environment.close failed for trajectory %s", idx)
            error = f"environment.close failed: {type(exc).__name__}: {exc}"
    if scope.cancelled_caught:
        logger.error("environment.close of trajectory %s did not finish within %g s", idx, timeout_s)
        error = f"environment.close did not finish within close_timeout_s={timeout_s:g}"
    metrics["env_time"] += time.perf_counter() - t0
    return error


async def _generate(engine: Engine, prompt: list[int], sampling: dict[str, Any], timeout_s: float) -> Generation:
    """`engine.generate`, aborted (by cancellation) and turned into `EngineTimeoutError` past `timeout_s`."""
    with anyio.move_on_after(timeout_s):
        return await engine.generate(prompt, sampling)
    raise EngineTimeoutError(f"engine request did not return within turn_timeout_s={timeout_s:g}; it was aborted")


async def _turn_loop(
    sample: Sample,
    idx: int,
    engine: Engine,
    environment: Environment,
    renderer: ChatRenderer,
    config: HarnessConfig,
    record: _Record,
    steps: list[Step],
    metrics: dict[str, Any],
    memory: MemorySimple | None,
    cursor: _Cursor,
    pause: anyio.Event | None = None,
) -> str:
    if not cursor.started:
        record.restart(renderer.prompt_ids(sample.messages, sample.tools), list(sample.messages))
        too_long = _prompt_too_long(len(record.prompt_ids), config.max_prompt_length, engine.max_model_len)
        if too_long:
            metrics["limit"] = too_long
            return TerminationReason.PROMPT_TOO_LONG
        cursor.started, cursor.observation = True, sample.messages[-1]["content"]
    observation: Any = cursor.observation
    for turn in range(cursor.turn, config.max_steps):
        if pause is not None and pause.is_set():  # a turn boundary: nothing of this turn has run yet
            cursor.turn, cursor.observation = turn, observation
            return _SUSPENDED
        if memory is not None:
            await _apply_memory(memory, sample, renderer, record, metrics)
        room, limit = _room(engine.max_model_len, config.max_response_length, record)
        if room <= 0:
            metrics["limit"] = f"before turn {turn}: {limit}"
            return TerminationReason.CONTEXT_LIMIT
        sampling = _turn_sampling(config, renderer, idx, turn, room)
        prompt = record.prompt_ids + record.response_ids
        version = engine.weight_version  # stamped on the turn: the weights it sampled with
        t0 = time.perf_counter()
        generation: Generation = await _generate(engine, prompt, sampling, config.turn_timeout_s)
        llm_time_s = time.perf_counter() - t0
        metrics["llm_time"] += llm_time_s
        ids = generation.token_ids
        end = read_turn(generation, renderer)
        if end.kind == ABORTED:
            raise EngineAbortedError(
                f"the engine ended turn {turn} with finish_reason {generation.finish_reason!r} after {len(ids)} "
                "sampled tokens; an aborted turn is never trained"
            )
        record.add_sampled(ids[: end.kept], generation.logprobs[: end.kept])
        if end.tail_ids:
            record.add_inserted(end.tail_ids)
        metrics["generated_tokens"] += end.kept
        text = end.content
        assistant = {"role": "assistant", "content": text}
        sample.messages.append(assistant)
        record.messages.append(assistant)
        if memory is not None:
            memory.add_message({"role": "assistant", "content": text or "(no output)"})
        thought, _ = split_thought(text)
        info: dict[str, Any] = {"finish_reason": generation.finish_reason, "stop_reason": generation.stop_reason,
                                "sampled_tokens": len(ids), "weight_version": version, "llm_time_s": llm_time_s}  # fmt: skip
        if end.kept < len(ids):  # the stop token or the tokens of a stop string: not part of the turn's content
            info["unrecorded_tokens"] = len(ids) - end.kept
        metrics["weight_version"] = min(metrics.get("weight_version", version), version)
        step = Step(
            chat_completions=list(sample.messages),
            thought=thought,
            action=text[text.find(TOOL_CALL_OPEN) :] if TOOL_CALL_OPEN in text else "",
            observation=observation,
            model_response=text,
            info=info,
        )
        if memory is not None:  # runs may be cut by memory rewrites: each step keeps its exact ids
            step.prompt_ids, step.response_ids, step.response_logprobs = prompt, list(ids), list(generation.logprobs)
        steps.append(step)
        if end.kind == CUT:
            # Cut by max_tokens (or the window or the budget): a half-written tool call must not run.
            info["truncated"] = True
            if generation.finish_reason == "length" and sampling.max_tokens == room:
                metrics["limit"] = f"turn {turn} sampled {len(ids)} tokens: {limit}"
                return TerminationReason.CONTEXT_LIMIT
            metrics["limit"] = (
                f"turn {turn} was cut after {len(ids)} tokens (finish_reason {generation.finish_reason!r}, "
                f"max_tokens {sampling.max_tokens})"
            )
            return TerminationReason.TRUNCATED
        t0 = time.perf_counter()
        result = await environment.step(sample)
        info["env_time_s"] = time.perf_counter() - t0
        metrics["env_time"] += info["env_time_s"]
        info.update(result.info)
        for key in ("tool_calls", "tool_errors", "well_formed_calls"):
            metrics[key] += int(result.info.get(key, 0))
        if result.done:
            return TerminationReason.ENV_DONE
        observation = [m.get("content", "") for m in result.observation]
        if turn + 1 == config.max_steps:
            info["observation_not_shown"] = observation  # the model gets no further turn to read it
            return TerminationReason.MAX_STEPS
        obs_ids = renderer.observation_ids(result.observation, sample.tools)
        if not end.closed:  # the turn stopped on another stop id or a stop string: the template closes it
            obs_ids = [renderer.end_of_turn_id, *obs_ids]
        room_after, limit = _room(engine.max_model_len, config.max_response_length, record, len(obs_ids))
        fits = room_after > 0
        if not fits and memory is None:
            info["observation_not_shown"] = observation
            metrics["limit"] = f"the observation after turn {turn} does not fit: {limit}"
            return TerminationReason.CONTEXT_LIMIT
        sample.messages.extend(result.observation)
        if fits:
            record.messages.extend(result.observation)
            record.add_inserted(obs_ids)
        if memory is not None:  # an observation that did not fit makes the next turn start a new, shorter run
            for message in result.observation:
                memory.add_message({"role": message["role"], "content": message.get("content") or "(empty)"})
    return TerminationReason.MAX_STEPS


def _prompt_too_long(prompt: int, max_prompt_length: int, max_model_len: int) -> str:
    """Which limits a first prompt of `prompt` tokens breaks, with the numbers ("" when it fits)."""
    broken = []
    if prompt > max_prompt_length:
        broken.append(f"max_prompt_length is {max_prompt_length}")
    if prompt >= max_model_len:
        broken.append(f"the model window (max_model_len) is {max_model_len}, which leaves no room for a response")
    return f"prompt has {prompt} tokens; {' and '.join(broken)}" if broken else ""


def _room(max_model_len: int, max_response_length: int, record: _Record, extra: int = 0) -> tuple[int, str]:
    """Tokens left after `extra` more, and the limit that leaves the fewest, named with its numbers."""
    window = max_model_len - record.total_length - extra
    budget = max_response_length - len(record.response_ids) - extra
    more = f" + {extra} more" if extra else ""
    if window <= budget:
        used = f"prompt {len(record.prompt_ids)} + response {len(record.response_ids)}{more}"
        return window, f"the model window (max_model_len) is {max_model_len} tokens, {used} leave {window}"
    used = f"{len(record.response_ids)}{more} tokens used"
    return budget, f"the response budget (max_response_length) is {max_response_length} tokens, {used} leave {budget}"


async def _apply_memory(
    memory: MemorySimple, sample: Sample, renderer: ChatRenderer, record: _Record, metrics: dict[str, Any]
) -> None:
    """Ask memory for the prompt messages; if it rewrote the history, start a new exact run from them."""
    if isinstance(memory, MemorySummary):
        prompt_messages = await memory.aget_prompt_messages()
        metrics["summaries"], metrics["summary_fallbacks"] = memory.summaries, memory.fallbacks
    else:
        prompt_messages = memory.get_prompt_messages()
    wanted = to_template_messages(prompt_messages)
    if wanted != [{"role": m["role"], "content": m["content"]} for m in record.messages]:
        record.restart(renderer.prompt_ids(wanted, sample.tools), wanted)
        metrics["continuous"] = False
