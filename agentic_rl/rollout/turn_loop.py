"""One trajectory's turn loop: generate -> environment step -> observe, until a stop condition.

Tokens are recorded by the trajectory's `RunRecorder` (`agentic_rl.types`): every sampled token with the engine's
logprob and weight version, every inserted token (observation, template glue) with mask 0. Memory that rewrites the
history starts a new run. Each stop condition is a small predicate returning `(reason, limit)` or None.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import anyio

from agentic_rl.chat import Segment
from agentic_rl.engine.base import Generation, sampled_versions
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import ABORTED, TurnEnd, read_turn
from agentic_rl.environments.base import StepResult
from agentic_rl.errors import EngineAbortedError, TemplateError
from agentic_rl.memory import MemorySummary, to_template_messages
from agentic_rl.parser import action_text, split_thought, tool_call_format
from agentic_rl.rewards.shaping import TurnFacts
from agentic_rl.rollout.bounded import env_call, generate_within
from agentic_rl.rollout.retries import tool_failure
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.rollout.state import TrajectoryState
from agentic_rl.rollout.turn_limits import Stop, cut_stop, prompt_too_long, room_left, turn_sampling
from agentic_rl.types import Step, TerminationReason, TokenRun

__all__ = ["turn_loop"]

logger = logging.getLogger(__name__)

# ---- the turn loop ------------------------------------------------------------------------------------------------


async def turn_loop(spec: RolloutSpec, state: TrajectoryState, pause: anyio.Event | None) -> TerminationReason | None:
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


def _start_run(state: TrajectoryState, prompt_ids: list[int], budget_offset: int = 0) -> None:
    """Begin a new exact run (the first, after memory rewrote the history, or where the template rewrites it)."""
    state.recorder.start(prompt_ids)
    state.segments = [Segment(tuple(prompt_ids), sampled=False)]
    state.budget_offset = budget_offset


def _insert(state: TrajectoryState, ids: Sequence[int]) -> None:
    """Append inserted ids (a stop string's tail, an observation and its glue) to the current run."""
    state.recorder.insert(ids)
    state.segments.append(Segment(tuple(ids), sampled=False))


def _stopped(state: TrajectoryState, stop: Stop) -> TerminationReason:
    reason, limit = stop
    if limit:
        state.metrics["limit"] = limit
    return reason


def _start(spec: RolloutSpec, state: TrajectoryState) -> Stop | None:
    """Render the first prompt and start the first run; stop if it is too long."""
    assert state.sample is not None
    state.messages = list(state.sample.messages)
    _start_run(state, spec.renderer.prompt_ids(state.sample.messages, state.sample.tools))
    state.observation = state.sample.messages[-1]["content"]
    return prompt_too_long(
        len(state.recorder.current.prompt_ids), spec.config.max_prompt_length, spec.engine.max_model_len
    )


async def _one_turn(spec: RolloutSpec, state: TrajectoryState, turn: int) -> Stop | None:
    """One generation and, unless it ends the trajectory, its environment step and observation."""
    assert state.sample is not None
    if state.memory is not None:
        await _apply_memory(spec, state)
    room, limit = room_left(spec, state.recorder.current, offset=state.budget_offset)
    if room <= 0:
        return TerminationReason.CONTEXT_LIMIT, f"before turn {turn}: {limit}"
    sampling = turn_sampling(spec, state.idx, turn, room, state.attempt)
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
    unavailable = tool_failure(result.info)
    if unavailable is not None:  # a tool's service failed: not the policy's doing (the record keeps what it read)
        state.sample.messages.extend(result.observation)
        raise unavailable
    if result.done:
        return TerminationReason.ENV_DONE, ""
    return _observe(spec, state, turn, result, end, step)


async def _generate(
    spec: RolloutSpec, state: TrajectoryState, turn: int, sampling: SamplingConfig
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


def _observe(
    spec: RolloutSpec, state: TrajectoryState, turn: int, result: StepResult, end: TurnEnd, step: Step
) -> Stop | None:
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
    spec: RolloutSpec, state: TrajectoryState, turn: int, result: StepResult, step: Step, problem: str
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


async def _apply_memory(spec: RolloutSpec, state: TrajectoryState) -> None:
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
