"""A turn's limits: the room a turn has (model window, response budget), its sampling options, and the stop
conditions of the first prompt and of a cut turn. Pure functions of the rollout spec and the current run."""

from __future__ import annotations

from agentic_rl.engine.base import Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.turns import CUT, TurnEnd
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.types import TerminationReason, TokenRun

__all__ = ["Stop", "cut_stop", "prompt_too_long", "room_left", "turn_sampling"]

Stop = tuple[TerminationReason, str]
"""Why the turn loop stops, and the limit that bit ("" when none did)."""


def prompt_too_long(prompt: int, max_prompt_length: int, max_model_len: int) -> Stop | None:
    """Stop when a first prompt of `prompt` tokens breaks `max_prompt_length` or fills the window."""
    broken = []
    if prompt > max_prompt_length:
        broken.append(f"max_prompt_length is {max_prompt_length}")
    if prompt >= max_model_len:
        broken.append(f"the model window (max_model_len) is {max_model_len}, which leaves no room for a response")
    if not broken:
        return None
    return TerminationReason.PROMPT_TOO_LONG, f"prompt has {prompt} tokens; {' and '.join(broken)}"


def cut_stop(
    generation: Generation, end: TurnEnd, sampling: SamplingConfig, room: int, limit: str, turn: int
) -> Stop | None:
    """Stop on a turn cut by `max_tokens`: `context_limit` when the window or the response budget set that
    `max_tokens`, else `truncated`."""
    if end.kind != CUT:
        return None
    n = len(generation.token_ids)
    if generation.finish_reason == "length" and sampling.max_tokens == room:
        return TerminationReason.CONTEXT_LIMIT, f"turn {turn} sampled {n} tokens: {limit}"
    return TerminationReason.TRUNCATED, (
        f"turn {turn} was cut after {n} tokens (finish_reason "
        f"{generation.finish_reason!r}, max_tokens {sampling.max_tokens})"
    )


def room_left(spec: RolloutSpec, run: TokenRun, extra: int = 0, *, offset: int = 0) -> tuple[int, str]:
    """Tokens left after `extra` more, and the limit that leaves the fewest, named with its numbers. `offset`: tokens
    of the run's prompt that count against the response budget (the history after the first prompt, in a run that
    a template rewrite began)."""
    max_model_len, max_response_length = spec.engine.max_model_len, spec.config.max_response_length
    window = max_model_len - run.total_length - extra
    budget = max_response_length - offset - len(run.response_ids) - extra
    more = f" + {extra} more" if extra else ""
    if window <= budget:
        used = f"prompt {len(run.prompt_ids)} + response {len(run.response_ids)}{more}"
        return window, f"the model window (max_model_len) is {max_model_len} tokens, {used} leave {window}"
    used = f"{offset + len(run.response_ids)}{more} tokens used"
    return budget, f"the response budget (max_response_length) is {max_response_length} tokens, {used} leave {budget}"


def turn_sampling(spec: RolloutSpec, idx: int, turn: int, room: int, attempt: int = 0) -> SamplingConfig:
    """The turn's sampling: `max_tokens` clamped to `room` and `min_tokens` to that `max_tokens` (a turn with less
    room than `min_tokens` is cut by the limit, not refused by the engine), the end-of-turn token among the stop
    ids, and the seed derived for this trajectory, turn and attempt (a retry samples afresh)."""
    base = spec.config.sampling
    stop_ids = list(base.stop_token_ids or [])
    if spec.renderer.end_of_turn_id not in stop_ids:
        stop_ids.append(spec.renderer.end_of_turn_id)
    max_tokens = room if base.max_tokens is None else min(base.max_tokens, room)
    update = {"max_tokens": max_tokens, "min_tokens": min(base.min_tokens, max_tokens), "stop_token_ids": stop_ids}
    return base.model_copy(update=update).derived(trajectory=idx, turn=turn, attempt=attempt)
