"""`min_tokens` is clamped with `max_tokens` to the room a turn has: a turn with less room than `min_tokens` is cut
by the limit (`context_limit`), never refused by the engine (real engine, real harness)."""

from __future__ import annotations

from typing import Any

from support.engines import RecordingEngine, SteeredEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.rollout.harness import run_trajectory
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec
from agentic_rl.types import TerminationReason


class EchoEnvironment(Environment):
    """Never ends a trajectory: every step answers `ok` as a tool message."""

    async def reset(self, request: dict[str, Any]) -> Sample:
        return Sample(id=request["trajectory_id"], task=request, messages=[{"role": "user", "content": "Count."}])

    async def step(self, sample: Sample) -> StepResult:
        return StepResult([{"role": "tool", "content": "ok"}], False, {})


def _spec(engine: Any, tokenizer: Any, *, max_response_length: int, sampling: dict[str, Any]) -> RolloutSpec:
    config = HarnessConfig(max_steps=4, max_response_length=max_response_length, sampling=sampling)
    return RolloutSpec(engine=engine, environment=EchoEnvironment(), renderer=ChatRenderer(tokenizer), config=config)


async def test_a_first_turn_with_less_room_than_min_tokens_is_cut_by_the_response_budget(engine, tokenizer):
    recording = RecordingEngine(engine)
    spec = _spec(recording, tokenizer, max_response_length=6, sampling={"temperature": 0.0, "min_tokens": 12})

    traj = await run_trajectory({"id": 0, "question": "Count."}, 0, spec)

    assert not traj.failed, traj.error
    assert traj.termination_reason == TerminationReason.CONTEXT_LIMIT
    (_, sampling, generation), *_ = recording.calls
    assert (sampling.max_tokens, sampling.min_tokens) == (6, 6)
    assert len(generation.token_ids) == 6 and traj.response_masks.tolist() == [1] * 6


async def test_a_late_turn_with_less_room_than_min_tokens_is_cut_not_failed(engine, tokenizer):
    # turn 0 is steered to a short answer (min_tokens 0, a fixed text); later turns ask for at least 64 tokens
    steered = SteeredEngine(
        engine, tokenizer, lambda turn: {"min_tokens": 0, "regex": "Let me see."} if turn == 0 else {}
    )
    spec = _spec(steered, tokenizer, max_response_length=48, sampling={"temperature": 0.0, "min_tokens": 64})

    traj = await run_trajectory({"id": 0, "question": "Count."}, 0, spec)

    assert not traj.failed, traj.error
    assert traj.termination_reason == TerminationReason.CONTEXT_LIMIT
    assert len(steered.calls) == 2 and len(traj.steps) == 2
    _, late, generation = steered.calls[1]
    room = 48 - len(steered.calls[1][0]) + len(steered.calls[0][0])  # the budget less turn 0 and the observation
    assert 0 < room < 64 and late.max_tokens == late.min_tokens == room
    assert len(generation.token_ids) == room and generation.finish_reason == "length"
    assert len(traj.response_tokens) == 48  # the whole response budget used
