"""The exact token runs of a trajectory, and why a trajectory is kept out of training.

A trajectory is one token sequence (one run) unless memory rewrote its history (`metrics["continuous"] == False`).
Then each rewrite started a new run: a new first prompt, followed by sampled ids and inserted observations, and
only the last run is held in the top-level token fields. Every `Step` of such a trajectory keeps the exact
`prompt_ids` it was sampled from and its `response_ids` / `response_logprobs`, so the runs can be rebuilt from the
steps: a step continues the previous step's run when its prompt starts with that step's prompt + response ids (the
ids in between are the inserted observation and template glue), and starts a new run otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from agentic_rl.errors import TrajectoryError
from agentic_rl.types import Step, Trajectory

__all__ = ["ABORTED_TERMINATIONS", "ExclusionReason", "exclusion_reason", "trajectory_runs"]

ExclusionReason = Literal["failed", "aborted"]

ABORTED_TERMINATIONS = frozenset({"aborted", "timeout", "cancelled"})
"""Termination reasons whose last engine request was aborted before it finished."""


def exclusion_reason(trajectory: Trajectory) -> ExclusionReason | None:
    """Why none of this trajectory's tokens may enter the loss, or None when they all may.

    `aborted`: the engine aborted one of its turns (a step whose `info["finish_reason"]` is `abort`, or a
    termination reason in `ABORTED_TERMINATIONS`); the turn's tokens are a cut-off sample and the reward judged an
    answer the policy did not finish, so the whole trajectory is left out, even if it was not marked failed.
    `failed`: `trajectory.failed` for any other reason (an error in the engine, environment or reward).
    """
    steps: Sequence[Step] = getattr(trajectory, "steps", None) or ()
    if trajectory.termination_reason in ABORTED_TERMINATIONS or any(
        s.info.get("finish_reason") == "abort" for s in steps
    ):
        return "aborted"
    return "failed" if trajectory.failed else None


def trajectory_runs(trajectory: Trajectory) -> list[Trajectory]:
    """One `Trajectory` per exact token run, in order; together they hold every token the engine sampled.

    A continuous trajectory (the default; `metrics["continuous"]` missing or True) is its own single run. One whose
    history memory rewrote is rebuilt from its steps (see the module docstring): each run's `prompt_tokens` is the
    exact prompt of its first step, `response_tokens` its sampled ids (mask 1, with the engine's logprobs) and the
    inserted ids between turns (mask 0, logprob 0). Each run carries the trajectory's `idx`, reward, `failed`,
    `termination_reason` and `metrics`.

    Raises:
        TrajectoryError: if the history was rewritten but a step has no `prompt_ids` (its tokens cannot be placed),
            or a step's `response_logprobs` is neither empty nor as long as its `response_ids`, or only some steps
            have logprobs.
    """
    if trajectory.metrics.get("continuous", True) is not False:
        return [trajectory]
    steps: Sequence[Step] = getattr(trajectory, "steps", None) or ()
    if not steps or any(not s.prompt_ids for s in steps):
        raise TrajectoryError(
            f"trajectory {trajectory.idx}: its history was rewritten (metrics['continuous'] is False) but "
            f"{'it has no steps' if not steps else 'a step has no prompt_ids'}, so its earlier runs are lost"
        )
    with_logprobs = [bool(s.response_logprobs) for s in steps if s.response_ids]
    if any(with_logprobs) and not all(with_logprobs):
        raise TrajectoryError(f"trajectory {trajectory.idx}: only some steps recorded response_logprobs")
    runs: list[tuple[list[int], list[int], list[int], list[float]]] = []  # prompt, response, mask, logprobs
    for k, step in enumerate(steps):
        ids = list(step.response_ids)
        logprobs = list(step.response_logprobs) if step.response_logprobs else [0.0] * len(ids)
        if len(logprobs) != len(ids):
            raise TrajectoryError(f"trajectory {trajectory.idx}, step {k}: {len(step.response_logprobs)} "
                                  f"response_logprobs for {len(ids)} response_ids")  # fmt: skip
        prompt = list(step.prompt_ids)
        if runs:
            head_prompt, response, mask, lps = runs[-1]
            head = len(head_prompt) + len(response)
            if (
                len(prompt) >= head
                and prompt[: len(head_prompt)] == head_prompt
                and prompt[len(head_prompt) : head] == response
            ):
                glue = prompt[head:]
                response += glue + ids
                mask += [0] * len(glue) + [1] * len(ids)
                lps += [0.0] * len(glue) + logprobs
                continue
        runs.append((prompt, ids, [1] * len(ids), logprobs))
    has_logprobs = any(with_logprobs)
    return [
        Trajectory(
            prompt_tokens=prompt,
            response_tokens=response,
            response_masks=mask,
            response_logprobs=lps if has_logprobs else None,
            idx=trajectory.idx,
            trajectory_reward=trajectory.trajectory_reward,
            metrics=dict(trajectory.metrics),
            termination_reason=trajectory.termination_reason,
            failed=trajectory.failed,
            error=trajectory.error,
        )  # fmt: skip
        for prompt, response, mask, lps in runs
    ]
