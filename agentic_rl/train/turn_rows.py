"""Step-level rows for `StepTrajectory`: one training row per turn, rewarded with its discounted return.

`step_units` turns a rollout into what step-level training packs (`GRPOConfig.advantage = "step"`): one row per turn
of every valid trajectory, each with its turn index and Monte-Carlo return, so that `batch_advantages` can normalize
the returns within each task group per turn index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.packing import default_group_ids, exclusion_reason
from agentic_rl.types import Step, StepTrajectory, TokenRun, Trajectory, is_finite_number

__all__ = ["StepUnits", "discounted_returns", "step_rows", "step_units"]


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


def _step_run(step: Step) -> TokenRun:
    """The exact token run of one step: its run's prompt and everything before the step as the prompt, the step's
    span of the run as the response (mask, logprobs and weight versions as recorded; None where not recorded)."""
    assert step.run is not None
    run, (start, end) = step.run, step.span
    logprobs = None if run.response_logprobs is None else run.response_logprobs[start:end]
    versions = None if run.weight_versions is None else run.weight_versions[start:end]
    return TokenRun(
        prompt_ids=step.prompt_ids,
        response_ids=run.response_ids[start:end],
        response_mask=run.response_mask[start:end],
        response_logprobs=logprobs,
        weight_versions=versions,
    )


def step_rows(
    trajectory: StepTrajectory, *, gamma: float = 1.0, rewards: Sequence[float] | None = None
) -> list[Trajectory]:
    """One `Trajectory` per step: its exact prompt, its sampled ids, and reward `mc_return`.

    A step's tokens come from the run it was sampled in (`Step.run`, `Step.span`): its prompt is the run's prompt and
    everything before the step, its response the ids it sampled (the run's mask over the span, 1 on sampled ids, with
    the engine's logprobs and weight versions). Each step's `mc_return` is set from the step rewards (or `rewards`,
    one per step, when given) with `discounted_returns`.

    Raises:
        TrajectoryError: if a step records no token run, or a step reward is not a finite number.
    """
    steps = trajectory.steps
    rewards = [s.reward for s in steps] if rewards is None else list(rewards)
    for k, (step, reward) in enumerate(zip(steps, rewards, strict=True)):
        if step.run is None:
            raise TrajectoryError(f"trajectory {trajectory.idx}, step {k}: no token run recorded")
        if not is_finite_number(reward):
            raise TrajectoryError(
                f"trajectory {trajectory.idx}, step {k}: reward must be a finite number, got {reward!r}"
            )
    returns = discounted_returns(rewards, gamma)
    rows = []
    for step, g in zip(steps, returns, strict=True):
        step.mc_return = g
        rows.append(
            Trajectory.from_runs(
                [_step_run(step)],
                idx=trajectory.idx,
                trajectory_reward=g,
                termination_reason=trajectory.termination_reason,
            )
        )
    return rows


def _covers_its_tokens(trajectory: Trajectory) -> bool:
    """Whether `trajectory` has step records whose spans hold exactly the tokens it sampled, each in one of its runs."""
    steps = getattr(trajectory, "steps", None)
    if not steps:
        return False
    runs = trajectory.token_runs()
    owned = {id(run) for run in runs}
    if any(step.run is None or id(step.run) not in owned for step in steps):
        return False
    in_steps = sum(sum(step.run.response_mask[slice(*step.span)]) for step in steps)  # type: ignore[union-attr]
    return in_steps == sum(run.num_sampled for run in runs)


def step_rewards(trajectory: StepTrajectory) -> list[float]:
    """The steps' rewards, which step-level training learns from; for steps the harness did not credit
    (`StepTrajectory.credited` False: built outside it, e.g. captured by the server) that all carry 0 while the
    trajectory has a reward: that reward on the last step."""
    rewards = [step.reward for step in trajectory.steps]
    if not trajectory.credited and trajectory.trajectory_reward != 0 and all(r == 0 for r in rewards):
        rewards[-1] = trajectory.trajectory_reward
    return rewards


@dataclass(frozen=True, slots=True)
class StepUnits:
    """What step-level training packs: U units, each one row's trajectory, with its group and turn index.

    Attributes:
        units: U trajectories to pack (`pack_trajectories`): one per step of each valid trajectory with step records
            (`step_rows`: reward `mc_return`); an excluded trajectory (`exclusion_reason`) as itself, so that its
            sampled tokens are counted as excluded; a valid trajectory without usable step records as itself.
        group_ids: U ints, the task group of each unit's trajectory.
        turns: U ints, the turn index of each unit (0 for a trajectory packed as itself).
        owners: U ints, the index of each unit's trajectory in the rollout.
        rewards: the `trajectory_reward` of each valid trajectory, in rollout order (for the step's metrics).
        lengths: the tokens each valid trajectory sampled, over all its runs, in rollout order.
    """

    units: list[Trajectory]
    group_ids: list[int]
    turns: list[int]
    owners: list[int]
    rewards: list[float]
    lengths: list[int]


def step_units(
    trajectories: Sequence[Trajectory], *, group_ids: Sequence[int] | None = None, gamma: float = 1.0
) -> StepUnits:
    """Split a rollout into step rows for step-level advantages.

    A valid trajectory whose `steps` each point into one of its runs and together hold every token it sampled
    (always so for the harness's) gives one unit per step, in turn order, rewarded with the step's discounted return
    (`step_rows`; `Step.mc_return` is set). Steps the harness did not credit (`StepTrajectory.credited` False, e.g. a
    record captured by the server) that all carry 0 while the trajectory has a reward take `trajectory_reward` as
    the last step's reward (`step_rewards`). Any
    other valid trajectory (no step records, as a user's agent may return, or steps that do not cover its tokens) is
    one unit at turn 0 rewarded with its `trajectory_reward`. Every sampled token of the rollout is in exactly one
    unit, so packing the units keeps `tokens_sampled == tokens_trained + tokens_excluded`.

    Args:
        trajectories: N trajectories.
        group_ids: one int per trajectory naming its task group; default as `pack_trajectories`.
        gamma: discount of the returns, in [0, 1].

    Raises:
        TrajectoryError: if `trajectories` is empty, `group_ids` has the wrong length, gamma is outside [0, 1], or a
            step reward of a valid trajectory is not a finite number.
    """
    if not trajectories:
        raise TrajectoryError("cannot split an empty list of trajectories into steps")
    groups = list(group_ids) if group_ids is not None else default_group_ids(trajectories)
    if len(groups) != len(trajectories):
        raise TrajectoryError(f"group_ids has {len(groups)} entries for {len(trajectories)} trajectories")
    out = StepUnits([], [], [], [], [], [])
    for i, (t, group) in enumerate(zip(trajectories, groups, strict=True)):
        valid = exclusion_reason(t) is None
        by_step = valid and _covers_its_tokens(t)
        rows = step_rows(t, gamma=gamma, rewards=step_rewards(t)) if by_step else [t]  # type: ignore[arg-type]
        out.units.extend(rows)
        out.group_ids.extend([group] * len(rows))
        out.turns.extend(range(len(rows)))
        out.owners.extend([i] * len(rows))
        if valid:
            out.rewards.append(float(t.trajectory_reward))
            out.lengths.append(sum(run.num_sampled for run in t.token_runs()))
    return out
