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


def step_rows(trajectory: StepTrajectory, *, gamma: float = 1.0) -> list[Trajectory]:
    """One `Trajectory` per step: its exact prompt, its sampled ids, and reward `mc_return`.

    A step's tokens come from the run it was sampled in (`Step.run`, `Step.span`): its prompt is the run's prompt and
    everything before the step, its response the ids it sampled (mask 1, with the engine's logprobs). Each step's
    `mc_return` is set from the step rewards with `discounted_returns`.

    Raises:
        TrajectoryError: if a step records no token run.
    """
    steps = trajectory.steps
    returns = discounted_returns([s.reward for s in steps], gamma)
    for step, g in zip(steps, returns, strict=True):
        step.mc_return = g
    rows = []
    for k, step in enumerate(steps):
        if step.run is None:
            raise TrajectoryError(f"trajectory {trajectory.idx}, step {k}: no token run recorded")
        response = step.response_ids
        logprobs = step.response_logprobs or [0.0] * len(response)
        rows.append(Trajectory(prompt_tokens=step.prompt_ids, response_tokens=response, response_masks=[1] * len(response),
                               response_logprobs=logprobs, idx=trajectory.idx, trajectory_reward=step.mc_return,
                               failed=trajectory.failed))  # fmt: skip
    return rows
