"""Step-level rows for `StepTrajectory`: one training row per turn, rewarded with its discounted return."""

from __future__ import annotations

from collections.abc import Sequence

from agentic_rl.errors import TrajectoryError
from agentic_rl.types import StepTrajectory, Trajectory

__all__ = ["discounted_returns", "step_rows"]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Monte-Carlo returns G_t = r_t + gamma * G_{t+1}, G_T = r_T (Sutton & Barto, eq. 3.9).

    Raises:
        TrajectoryError: if gamma is outside [0, 1].
    """
    if not 0.0 <= gamma <= 1.0:
        raise TrajectoryError(f"gamma must be in [0, 1], got {gamma}")
    out = [0.0] * len(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def _sampled_runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def step_rows(trajectory: StepTrajectory, *, gamma: float = 1.0) -> list[Trajectory]:
    """One `Trajectory` per step: its exact prompt, its sampled ids, and reward `mc_return`.

    Steps that carry their own `prompt_ids` / `response_ids` (memory, server capture) use them. Otherwise the step's
    tokens come from the continuous record: step k's response is the k-th run of sampled tokens and its prompt is
    everything before it. Each step's `mc_return` is set from the step rewards with `discounted_returns`.

    Raises:
        TrajectoryError: if the continuous record has fewer sampled runs than steps.
    """
    steps = trajectory.steps
    returns = discounted_returns([s.reward for s in steps], gamma)
    for step, g in zip(steps, returns, strict=True):
        step.mc_return = g
    prompt = trajectory.prompt_tokens.tolist()
    response = trajectory.response_tokens.tolist()
    mask = trajectory.response_masks.tolist()
    logprobs = trajectory.response_logprobs.tolist() if trajectory.response_logprobs is not None else [0.0] * len(mask)
    runs = _sampled_runs(mask)
    if any(not s.response_ids for s in steps) and len(runs) < len(steps):
        raise TrajectoryError(f"{len(steps)} steps but only {len(runs)} runs of sampled tokens")
    rows = []
    for k, step in enumerate(steps):
        if step.response_ids:
            p, r, lp = step.prompt_ids, step.response_ids, step.response_logprobs or [0.0] * len(step.response_ids)
        else:
            start, end = runs[k]
            p, r, lp = prompt + response[:start], response[start:end], logprobs[start:end]
        rows.append(Trajectory(prompt_tokens=p, response_tokens=r, response_masks=[1] * len(r), response_logprobs=lp,
                               idx=trajectory.idx, trajectory_reward=step.mc_return, failed=trajectory.failed))  # fmt: skip
    return rows
