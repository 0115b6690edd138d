"""One trajectory's turn loop: reset, then generate -> environment step -> observe, until a stop condition.

A trajectory's tokens are recorded by a `RunRecorder` (`agentic_rl.types`): every sampled token with the engine's
logprob and weight version, every inserted token (observation, template glue) with mask 0. Memory that rewrites the
history starts a new run. Each stop condition is a small predicate returning `(reason, limit)` or None.

This is the single place per trajectory that turns an unexpected exception into a failed trajectory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentic_rl.chat import Segment, check_alignment
from agentic_rl.engine.base import Generation, sampled_versions
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import ABORTED, TurnEnd, read_turn
from agentic_rl.environments.base import Sample, StepResult
from agentic_rl.errors import (
    AgenticRLError,
    EngineAbortedError,
    EngineTimeoutError,
    EnvStepError,
    EnvTimeoutError,
    TemplateError,
    TrajectoryError,
)
from agentic_rl.memory import MemorySimple, MemorySummary, to_template_messages
from agentic_rl.parser import action_text, split_thought, tool_call_format
from agentic_rl.rewards.base import score_answer
from agentic_rl.rewards.shaping import TrajectoryFacts, TurnFacts
from agentic_rl.rollout.bounded import close_sample, env_call, generate_within
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.rollout.turn_limits import Stop, cut_stop, prompt_too_long, room_left, turn_sampling
from agentic_rl.types import RunRecorder, Step, StepTrajectory, TerminationReason, TokenRun

__all__ = [
    "HarnessConfig",
    "RewardCallable",
    "RolloutSpec",
    "TerminationReason",
    "TrajectoryCheckpoint",
    "run_trajectory",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _State:
    """Everything one trajectory has done so far: what a `TrajectoryCheckpoint` holds."""

    task: dict[str, Any]
    idx: int
    sample: Sample | None = None
    steps: list[Step] = field(default_factory=list)
    metrics: dict[str, Any] = field(
        default_factory=lambda: {
            "llm_time": 0.0,
            "env_time": 0.0,
            "reward_time": 0.0,
            "tool_calls": 0,
            "tool_errors": 0,
            "well_formed_calls": 0,
        }
    )
    recorder: RunRecorder = field(default_factory=RunRecorder)
    messages: list[dict[str, Any]] = field(default_factory=list)  # what the current run renders
    segments: list[Segment] = field(default_factory=list)  # the current run, one segment per append (alignment check)
    memory: MemorySimple | None = None
    turn: int = 0  # the next turn to generate
    observation: Any = None  # what the model saw last
    elapsed_s: float = 0.0
    milestones: list[str] = field(default_factory=list)  # the task's, validated once when it starts
    turn_facts: dict[int, TurnFacts] = field(default_factory=dict)  # by step: what shaping reads of each turn
    budget_offset: int = 0  # response-budget tokens the current run's prompt holds (a run a template rewrite began)


@dataclass(slots=True)
class TrajectoryCheckpoint:
    """An unfinished trajectory stopped at a turn boundary (before a generation), ready to be resumed.

    The environment is **not** closed: `sample` is the live handle of its per-trajectory state (tool sessions,
    sandbox processes stay open), so a checkpoint can be resumed only in the same process, with the same
    environment object; `Rollout.discard` closes the environments of checkpoints that will not be resumed.
    Resuming continues with turn `turn` on exactly the recorded token ids (nothing is re-rendered or re-sampled).
    """

    _state: _State

    @property
    def task(self) -> dict[str, Any]:
        """The validated task."""
        return self._state.task

    @property
    def idx(self) -> int:
        """The task's position in the batch (also offsets the sampling seed)."""
        return self._state.idx

    @property
    def sample(self) -> Sample:
        """The environment's live state of this trajectory."""
        assert self._state.sample is not None
        return self._state.sample

    @property
    def turn(self) -> int:
        """Index of the next turn to generate (0 = suspended after `reset`, before any generation)."""
        return self._state.turn

    @property
    def steps(self) -> list[Step]:
        """The `Step` of each turn generated so far."""
        return self._state.steps

    @property
    def metrics(self) -> dict[str, Any]:
        """The trajectory's metrics so far (times, tool-call counts)."""
        return self._state.metrics

    @property
    def elapsed_s(self) -> float:
        """Wall-clock seconds the trajectory ran before it was suspended."""
        return self._state.elapsed_s

    @property
    def runs(self) -> list[TokenRun]:
        """The token runs recorded so far."""
        return self._state.recorder.runs

    @property
    def prompt_ids(self) -> list[int]:
        """The first prompt of the current exact run (token ids)."""
        return list(self._state.recorder.current.prompt_ids) if self.runs else []

    @property
    def response_ids(self) -> list[int]:
        """Everything after `prompt_ids` so far: sampled and inserted token ids."""
        return list(self._state.recorder.current.response_ids) if self.runs else []

    @property
    def weight_versions(self) -> list[int]:
        """The engine weight version of each generated turn, in order."""
        return [int(step.info.get("weight_version", 0)) for step in self.steps]


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
        aborted) and the error message; a failing or hanging `environment.close` also fails the trajectory.
        Cancellation still propagates after `environment.close` ran (once).
    """
    state = checkpoint._state if checkpoint is not None else _State(task, idx)
    started = time.perf_counter() - state.elapsed_s
    reason: TerminationReason | None = TerminationReason.ERROR
    error: str | None = None
    reward = 0.0
    try:
        if checkpoint is None:
            await _reset(spec, state)
        reason = await _turn_loop(spec, state, pause)
        if reason is None:
            state.elapsed_s = time.perf_counter() - started
            return TrajectoryCheckpoint(state)
        if reason == TerminationReason.PROMPT_TOO_LONG:
            error = state.metrics["limit"]
        else:
            reward = await _reward(spec, state)
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        reason, error, reward = _failure(exc, state), f"{type(exc).__name__}: {exc}", 0.0
    finally:
        if state.sample is not None and reason is not None:
            t0 = time.perf_counter()
            close_error = await close_sample(spec.environment, state.sample, state.idx, spec.config.close_timeout_s)
            state.metrics["env_time"] += time.perf_counter() - t0
            if close_error is not None and error is None:
                reason, error, reward = TerminationReason.ERROR, close_error, 0.0
    return _finish(spec, state, reason, error, reward, time.perf_counter() - started)


async def _reset(spec: RolloutSpec, state: _State) -> None:
    """`environment.reset` (bounded by `env_timeout_s`), then the memory of a new trajectory."""
    state.milestones = spec.config.shaping().milestones(state.task)  # a malformed list fails it before it starts
    t0 = time.perf_counter()
    request = {**state.task, "trajectory_id": f"{state.task.get('id', state.idx)}-{state.idx}"}
    state.sample = await env_call(spec.environment, "reset", request, spec.config.env_timeout_s)
    if not isinstance(state.sample, Sample):
        sample, state.sample = state.sample, None  # nothing to close
        raise EnvStepError(f"reset() must return a Sample, got {type(sample).__name__}")
    state.metrics["env_time"] += time.perf_counter() - t0
    if spec.memory_factory is not None:
        state.memory = spec.memory_factory()
        for message in state.sample.messages:
            state.memory.add_message(message)


async def _reward(spec: RolloutSpec, state: _State) -> float:
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


def _failure(exc: Exception, state: _State) -> TerminationReason:
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
    spec: RolloutSpec, state: _State, reason: TerminationReason, error: str | None, reward: float, total_s: float
) -> StepTrajectory:
    """The finished trajectory: rewards, the alignment check, and the record (a failed one if it is invalid).

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
    )
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
            runs, termination_reason=TerminationReason.ERROR, failed=True, error=f"TrajectoryError: {exc}", **common
        )


def _rewarded_task(state: _State) -> dict[str, Any]:
    """The task as `environment.reset` augmented (or replaced) it, which the reward read; without the
    `trajectory_id` the harness added to the request."""
    if state.sample is None or not isinstance(state.sample.task, dict):
        return state.task
    added = "trajectory_id" not in state.task
    return {k: v for k, v in state.sample.task.items() if not (added and k == "trajectory_id")}


def _check_alignment(spec: RolloutSpec, state: _State) -> None:
    """Compare the current run with a full re-render of its messages (metrics `alignment_mismatches`,
    `retokenize_drift`)."""
    tools = state.sample.tools if state.sample is not None else None
    report = check_alignment(spec.renderer, state.messages, state.segments, tools)
    state.metrics["alignment_mismatches"] = report.mismatches
    state.metrics["retokenize_drift"] = report.retokenize_drift
    if report.mismatches:
        logger.warning("trajectory %s: %d token alignment mismatches (%s)", state.idx, report.mismatches, report.detail)


# ---- the turn loop ------------------------------------------------------------------------------------------------


async def _turn_loop(spec: RolloutSpec, state: _State, pause: anyio.Event | None) -> TerminationReason | None:
    """Turns until a stop condition; None when `pause` stopped it at a turn boundary."""
    if not state.recorder.runs:
        stop = _start(spec, state)
        if stop is not None:
            return _stopped(state, stop)
    for turn in range(state.turn, spec.config.max_steps):
        if pause is not None and pause.is_set():  # a turn boundary: nothing of this turn has run yet
            state.turn = turn
            return None
        stop = await _one_turn(spec, state, turn)
        if stop is not None:
            return _stopped(state, stop)
    return TerminationReason.MAX_STEPS


def _start_run(state: _State, prompt_ids: list[int], budget_offset: int = 0) -> None:
    """Begin a new exact run (the first, after memory rewrote the history, or where the template rewrites it)."""
    state.recorder.start(prompt_ids)
    state.segments = [Segment(tuple(prompt_ids), sampled=False)]
    state.budget_offset = budget_offset


def _insert(state: _State, ids: Sequence[int]) -> None:
    """Append inserted ids (a stop string's tail, an observation and its glue) to the current run."""
    state.recorder.insert(ids)
    state.segments.append(Segment(tuple(ids), sampled=False))


def _stopped(state: _State, stop: Stop) -> TerminationReason:
    reason, limit = stop
    if limit:
        state.metrics["limit"] = limit
    return reason


def _start(spec: RolloutSpec, state: _State) -> Stop | None:
    """Render the first prompt and start the first run; stop if it is too long."""
    assert state.sample is not None
    state.messages = list(state.sample.messages)
    _start_run(state, spec.renderer.prompt_ids(state.sample.messages, state.sample.tools))
    state.observation = state.sample.messages[-1]["content"]
    return prompt_too_long(
        len(state.recorder.current.prompt_ids), spec.config.max_prompt_length, spec.engine.max_model_len
    )


async def _one_turn(spec: RolloutSpec, state: _State, turn: int) -> Stop | None:
    """One generation and, unless it ends the trajectory, its environment step and observation."""
    assert state.sample is not None
    if state.memory is not None:
        await _apply_memory(spec, state)
    room, limit = room_left(spec, state.recorder.current, offset=state.budget_offset)
    if room <= 0:
        return TerminationReason.CONTEXT_LIMIT, f"before turn {turn}: {limit}"
    sampling = turn_sampling(spec, state.idx, turn, room)
    generation, end, step = await _generate(spec, state, turn, sampling)
    stop = cut_stop(generation, end, sampling, room, limit, turn)
    if stop is not None:
        step.info["truncated"] = True  # a half-written tool call must not run
        return stop
    t0 = time.perf_counter()
    result = StepResult.of(await env_call(spec.environment, "step", state.sample, spec.config.env_timeout_s))
    step.info["env_time_s"] = time.perf_counter() - t0
    tool_results = result.observation if state.milestones else ()  # only milestones read them
    facts = state.turn_facts[len(state.steps) - 1] = TurnFacts.of(result.info, turn, step.action, tool_results)
    step.reward = facts.env_reward  # the environment's own reward for this turn
    state.metrics["env_time"] += step.info["env_time_s"]
    step.info.update(result.info)
    for key in ("tool_calls", "tool_errors", "well_formed_calls"):
        state.metrics[key] += int(result.info.get(key, 0))
    if result.done:
        return TerminationReason.ENV_DONE, ""
    return _observe(spec, state, turn, result, end, step)


async def _generate(
    spec: RolloutSpec, state: _State, turn: int, sampling: SamplingConfig
) -> tuple[Generation, TurnEnd, Step]:
    """Sample one assistant turn, record its tokens and its `Step`.

    Raises:
        EngineTimeoutError: past `turn_timeout_s` (the request is aborted).
        EngineAbortedError: when the engine ended the turn as aborted.
    """
    assert state.sample is not None
    run = state.recorder.current
    version = spec.engine.weight_version  # stamped on the turn (and on its tokens if the engine does not say)
    t0 = time.perf_counter()
    generation = await generate_within(
        spec.engine, run.prompt_ids + run.response_ids, sampling, spec.config.turn_timeout_s
    )
    llm_time_s = time.perf_counter() - t0
    state.metrics["llm_time"] += llm_time_s
    ids = generation.token_ids
    end = read_turn(generation, spec.renderer)
    if end.kind == ABORTED:
        raise EngineAbortedError(
            f"the engine ended turn {turn} with finish_reason {generation.finish_reason!r} after {len(ids)} "
            "sampled tokens; an aborted turn is never trained"
        )
    versions = sampled_versions(generation, version)  # per token: the weights whose forward pass sampled it
    run, span = state.recorder.sample(ids[: end.kept], generation.logprobs[: end.kept], versions[: end.kept])
    state.segments.append(Segment(tuple(ids[: end.kept]), sampled=True))
    if end.tail_ids:
        _insert(state, end.tail_ids)
    state.metrics["weight_version"] = min(state.metrics.get("weight_version", version), version)
    assistant = {"role": "assistant", "content": end.content}
    state.sample.messages.append(assistant)
    state.messages.append(assistant)
    if state.memory is not None:
        state.memory.add_message({"role": "assistant", "content": end.content or "(no output)"})
    info: dict[str, Any] = {
        "finish_reason": generation.finish_reason,
        "stop_reason": generation.stop_reason,
        "sampled_tokens": len(ids),
        "weight_version": version,
        "llm_time_s": llm_time_s,
    }
    if versions:  # [min, max] of its tokens: they differ when the weights changed while the turn was sampled
        info["weight_versions"] = [min(versions), max(versions)]
    if end.kept < len(ids):  # the stop token or the tokens of a stop string: not part of the turn's content
        info["unrecorded_tokens"] = len(ids) - end.kept
    step = Step(
        chat_completions=list(state.sample.messages),
        thought=split_thought(end.content)[0],
        action=action_text(end.content, tool_call_format(spec.renderer.tokenizer.chat_template)),
        observation=state.observation,
        model_response=end.content,
        info=info,
        run=run,
        span=span,
    )
    state.steps.append(step)
    return generation, end, step


def _observe(spec: RolloutSpec, state: _State, turn: int, result: StepResult, end: TurnEnd, step: Step) -> Stop | None:
    """Append the environment's observation to the record (and memory); stop when no turn is left to read it or
    it does not fit."""
    assert state.sample is not None
    observation = [m.get("content", "") for m in result.observation]
    state.observation = observation
    if turn + 1 == spec.config.max_steps:
        step.info["observation_not_shown"] = observation  # the model gets no further turn to read it
        return TerminationReason.MAX_STEPS, ""
    problem = spec.renderer.append_problem(result.observation)
    if problem is not None:
        return _observe_in_new_run(spec, state, turn, result, step, problem)
    obs_ids = spec.renderer.observation_ids(result.observation, state.sample.tools)
    if not end.closed:  # the turn stopped on another stop id or a stop string: the template closes it
        obs_ids = [spec.renderer.end_of_turn_id, *obs_ids]
    room_after, limit = room_left(spec, state.recorder.current, len(obs_ids), offset=state.budget_offset)
    fits = room_after > 0
    if not fits and state.memory is None:
        step.info["observation_not_shown"] = observation
        return TerminationReason.CONTEXT_LIMIT, f"the observation after turn {turn} does not fit: {limit}"
    state.sample.messages.extend(result.observation)
    if fits:
        state.messages.extend(result.observation)
        _insert(state, obs_ids)
    if state.memory is not None:  # an observation that did not fit makes the next turn start a new, shorter run
        for message in result.observation:
            state.memory.add_message({"role": message["role"], "content": message.get("content") or "(empty)"})
    return None


def _observe_in_new_run(
    spec: RolloutSpec, state: _State, turn: int, result: StepResult, step: Step, problem: str
) -> Stop | None:
    """Show an observation the template cannot append exactly (it writes earlier turns differently once it
    follows) by starting a new exact run, prompted with the template's render of the whole conversation: the
    tokens the model then sees. Against the response budget the new run starts from the tokens its prompt holds
    beyond the first prompt, or from every token sampled and inserted so far if that is more (a template that
    drops earlier turns must not let a trajectory sample past the budget).

    Raises:
        TemplateError: with `template_rewrites="refuse"`, or where the template leaves the observation out (of any
            render, or of this conversation's).
    """
    assert state.sample is not None
    cannot = spec.renderer.rerender_problem(result.observation)
    if spec.config.template_rewrites == "refuse" or cannot is not None:
        raise TemplateError(cannot or problem)
    messages = [*state.messages, *result.observation]
    rendered = spec.renderer.render_with_pieces(messages, state.sample.tools, add_generation_prompt=True)
    lost = [m for m in result.observation if not _shown(str(m.get("content") or ""), rendered.text)]
    if lost:
        raise TemplateError(
            f"the chat template leaves the observation {lost[0].get('content')!r:.60} out of the prompt"
        )
    prompt = spec.renderer.span_ids(rendered, 0, len(rendered.text))
    grown = len(prompt) - len(state.recorder.runs[0].prompt_ids)
    offset = max(0, grown, state.budget_offset + len(state.recorder.current.response_ids))
    room, limit = room_left(spec, TokenRun(prompt), offset=offset)
    if room <= 0 and state.memory is None:
        step.info["observation_not_shown"] = [m.get("content", "") for m in result.observation]
        return TerminationReason.CONTEXT_LIMIT, f"the observation after turn {turn} does not fit a new run: {limit}"
    state.sample.messages.extend(result.observation)
    if state.memory is not None:
        for message in result.observation:
            state.memory.add_message({"role": message["role"], "content": message.get("content") or "(empty)"})
    if room <= 0:  # the messages of the run stay as they were: the next turn's memory starts a shorter run
        return None
    state.messages = messages
    _start_run(state, prompt, offset)
    state.metrics["template_runs"] = state.metrics.get("template_runs", 0) + 1
    state.metrics["rerendered_prompt_tokens"] = state.metrics.get("rerendered_prompt_tokens", 0) + len(prompt)
    step.info["next_run"] = "template rewrite"
    return None


def _shown(content: str, text: str) -> bool:
    """Whether a template's `text` holds an observation's `content`: as given, trimmed, or JSON-escaped (templates
    that write tool results as JSON strings)."""
    return content in text or content.strip() in text or json.dumps(content)[1:-1] in text


async def _apply_memory(spec: RolloutSpec, state: _State) -> None:
    """Ask memory for the prompt messages; if it rewrote the history, start a new exact run from them.

    The memory measures its budget on the prompt exactly as the run renders it: this renderer, the sample's tools.
    """
    memory = state.memory
    assert memory is not None and state.sample is not None
    memory.render_with(spec.renderer.prompt_ids, state.sample.tools)
    if isinstance(memory, MemorySummary):
        prompt_messages = await memory.aget_prompt_messages()
        state.metrics["summaries"], state.metrics["summary_fallbacks"] = memory.summaries, memory.fallbacks
    else:
        prompt_messages = memory.get_prompt_messages()
    wanted = to_template_messages(prompt_messages)
    if wanted != [{"role": m["role"], "content": m["content"]} for m in state.messages]:
        _start_run(state, spec.renderer.prompt_ids(wanted, state.sample.tools))
        state.messages = wanted
