"""One trajectory's turn loop: reset, then generate -> environment step -> observe, until a stop condition.

This is the single place per trajectory that turns an unexpected exception into a failed trajectory.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentic_rl.engine.base import Engine, Generation
from agentic_rl.environments.base import Environment, Sample
from agentic_rl.errors import AgenticRLError, RewardError
from agentic_rl.memory import MemorySimple, MemorySummary, to_template_messages
from agentic_rl.parser import TOOL_CALL_OPEN, split_thought
from agentic_rl.rollout.tokens import ChatRenderer, Segment, check_alignment
from agentic_rl.types import Step, StepTrajectory

__all__ = ["HarnessConfig", "TerminationReason", "run_trajectory"]

logger = logging.getLogger(__name__)


class TerminationReason:
    """Why a turn loop stopped (the `termination_reason` of a trajectory)."""

    ENV_DONE = "env_done"  # the environment ended it (e.g. a final answer without a tool call)
    MAX_STEPS = "max_steps"  # `max_steps` turns used and the environment still wanted more
    TRUNCATED = "truncated"  # a turn hit the per-turn `max_tokens`; its half-written tool call is not run
    CONTEXT_LIMIT = "context_limit"  # no room left in the model window or the response budget
    PROMPT_TOO_LONG = "prompt_too_long"  # the first prompt alone exceeds `max_prompt_length` (failed)
    INVALID_TASK = "invalid_task"  # the task could not be read (failed)
    ERROR = "error"  # an exception in the engine, environment or reward (failed)


@dataclass(slots=True)
class HarnessConfig:
    """Limits and sampling of a rollout.

    Attributes:
        max_steps: most assistant turns per trajectory.
        max_prompt_length: most tokens of the first prompt.
        max_response_length: most tokens after the first prompt (sampled + inserted), the response budget.
        sampling: `vllm.SamplingParams` keyword arguments for every turn. `max_tokens`, if given, caps each turn; it
            is always clamped to what is left of the window and of the response budget. A `seed` is offset per
            trajectory and turn so that samples of one group differ. Seeded runs repeat exactly only with the same
            batch composition (`n_parallel_agents`, task order): the engine's numerics depend on the batch.
        toolcall_weight: `toolcall_reward = toolcall_weight * well-formed calls / attempted calls` (0 without calls).
        check_alignment: compare each finished trajectory's ids with a full template re-render (metrics
            `alignment_mismatches`, `retokenize_drift`).
    """

    max_steps: int = 5
    max_prompt_length: int = 128 * 1024
    max_response_length: int = 8 * 1024
    sampling: dict[str, Any] = field(default_factory=dict)
    toolcall_weight: float = 0.1
    check_alignment: bool = True


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


def _turn_sampling(config: HarnessConfig, renderer: ChatRenderer, idx: int, turn: int, room: int) -> dict[str, Any]:
    sampling = dict(config.sampling)
    requested = sampling.get("max_tokens")
    sampling["max_tokens"] = room if requested is None else min(int(requested), room)
    stop_ids = list(sampling.get("stop_token_ids") or [])
    if renderer.end_of_turn_id not in stop_ids:
        stop_ids.append(renderer.end_of_turn_id)
    sampling["stop_token_ids"] = stop_ids
    if sampling.get("seed") is not None:
        sampling["seed"] = (int(sampling["seed"]) + 1_000_003 * idx + 7_919 * turn) % (2**31 - 1)
    return sampling


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
) -> StepTrajectory:
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

    Returns:
        A `StepTrajectory`. An exception inside the loop does not propagate: it returns a trajectory with
        `failed=True`, `termination_reason="error"` and the error message; cancellation still propagates after
        `environment.close` ran.
    """
    started = time.perf_counter()
    metrics: dict[str, Any] = {
        "llm_time": 0.0, "env_time": 0.0, "reward_time": 0.0, "tool_calls": 0, "tool_errors": 0,
        "well_formed_calls": 0, "generated_tokens": 0, "continuous": True,
    }  # fmt: skip
    steps: list[Step] = []
    record = _Record([])
    sample: Sample | None = None
    reason = TerminationReason.ERROR
    error: str | None = None
    res_reward = 0.0
    try:
        t0 = time.perf_counter()
        sample = await environment.reset({**task, "trajectory_id": f"{task.get('id', idx)}-{idx}"})
        metrics["env_time"] += time.perf_counter() - t0
        memory = None
        if memory_factory is not None:
            memory = memory_factory()
            for message in sample.messages:
                memory.add_message(message)
        reason = await _turn_loop(sample, idx, engine, environment, renderer, config, record, steps, metrics, memory)
        if reason == TerminationReason.PROMPT_TOO_LONG:
            error = f"prompt has {len(record.prompt_ids)} tokens, max_prompt_length is {config.max_prompt_length}"
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
        res_reward = 0.0
    finally:
        if sample is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                t0 = time.perf_counter()
                try:
                    await environment.close(sample)
                except Exception:
                    logger.exception("environment.close failed for trajectory %s", idx)
                metrics["env_time"] += time.perf_counter() - t0

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
) -> str:
    record.restart(renderer.prompt_ids(sample.messages, sample.tools), list(sample.messages))
    if len(record.prompt_ids) > config.max_prompt_length or len(record.prompt_ids) >= engine.max_model_len:
        return TerminationReason.PROMPT_TOO_LONG
    observation: Any = sample.messages[-1]["content"]
    for turn in range(config.max_steps):
        if memory is not None:
            await _apply_memory(memory, sample, renderer, record, metrics)
        room = min(engine.max_model_len - record.total_length, config.max_response_length - len(record.response_ids))
        if room <= 0:
            return TerminationReason.CONTEXT_LIMIT
        sampling = _turn_sampling(config, renderer, idx, turn, room)
        prompt = record.prompt_ids + record.response_ids
        version = int(getattr(engine, "weight_version", 0))  # stamped on the turn: the weights it sampled with
        t0 = time.perf_counter()
        generation: Generation = await engine.generate(prompt, sampling)
        llm_time_s = time.perf_counter() - t0
        metrics["llm_time"] += llm_time_s
        ids = generation.token_ids
        record.add_sampled(ids, generation.logprobs)
        metrics["generated_tokens"] += len(ids)
        closed = bool(ids) and ids[-1] == renderer.end_of_turn_id
        text = renderer.decode(ids[:-1] if closed else ids)
        assistant = {"role": "assistant", "content": text}
        sample.messages.append(assistant)
        record.messages.append(assistant)
        if memory is not None:
            memory.add_message({"role": "assistant", "content": text or "(no output)"})
        thought, _ = split_thought(text)
        info: dict[str, Any] = {"finish_reason": generation.finish_reason, "sampled_tokens": len(ids),
                                "weight_version": version, "llm_time_s": llm_time_s}  # fmt: skip
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
        if not closed:
            # Cut by max_tokens (or the budget): a half-written tool call must not run.
            info["truncated"] = True
            limited_by_budget = sampling["max_tokens"] == room
            return TerminationReason.CONTEXT_LIMIT if limited_by_budget else TerminationReason.TRUNCATED
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
        room_after = min(
            engine.max_model_len - record.total_length - len(obs_ids),
            config.max_response_length - len(record.response_ids) - len(obs_ids),
        )
        fits = room_after > 0
        if not fits and memory is None:
            info["observation_not_shown"] = observation
            return TerminationReason.CONTEXT_LIMIT
        sample.messages.extend(result.observation)
        if fits:
            record.messages.extend(result.observation)
            record.add_inserted(obs_ids)
        if memory is not None:  # an observation that did not fit makes the next turn start a new, shorter run
            for message in result.observation:
                memory.add_message({"role": message["role"], "content": message.get("content") or "(empty)"})
    return TerminationReason.MAX_STEPS


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
