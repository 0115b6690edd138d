"""One task's GRPO group: what the rollout scheduler hands the trainer (`GRPOTrainer.train_step`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.train.packing import exclusion_reason, is_overlong
from agentic_rl.train.turn_rows import step_rewards
from agentic_rl.types import Trajectory

__all__ = ["TrajectoryGroup", "flatten_groups"]


@dataclass(slots=True)
class TrajectoryGroup:
    """The `group_size` samples of one task, and where the scheduler (`loop.scheduler.ContinuousRollout`) has it.

    Attributes:
        batch: the rollout batch it belongs to (its sampling seed's step, 0-based).
        position: the task's position within the batch.
        task: the task.
        trajectories: one slot per sample (index j is sample j), None until it finished.
        admitted_at: `steps_done` when its batch was admitted.
        finished_order: its rank among finished groups (0 = first to finish); -1 while running.
        draw: 0 for a group of the batch itself, d >= 1 for one of the batch's d-th extra draw (dynamic sampling;
            its position is then d * groups_per_step + its index in the draw).
        step_level: its samples train turn by turn (`GRPOConfig.advantage = "step"`): `constant` compares their
            per-turn rewards.
        overlong_filter: the trainer leaves samples a length limit cut out of the loss (`GRPOConfig.overlong_filter`).
    """

    batch: int
    position: int
    task: dict[str, Any]
    trajectories: list[Trajectory | None]
    admitted_at: int = 0
    finished_order: int = -1
    draw: int = 0
    step_level: bool = False
    overlong_filter: bool = False

    @property
    def samples(self) -> list[Trajectory]:
        """Its finished samples, in sample order (all of them once it `finished`)."""
        return [t for t in self.trajectories if t is not None]

    @property
    def finished(self) -> bool:
        return self.finished_order >= 0

    @property
    def failed(self) -> bool:
        """Every sample failed: nothing of it can be trained."""
        return all(t is not None and t.failed for t in self.trajectories)

    @property
    def constant(self) -> bool:
        """Its valid samples (`exclusion_reason` None: not failed, refused or aborted) all have the same
        `trajectory_reward`, or it has fewer than two: every GRPO advantage of the group is 0 (`group_advantages`).
        With `step_level`, the same per-turn rewards (`Step.reward` turn by turn, trailing zero rewards ignored):
        then every step's return equals its siblings' at the same turn index, so every `turn_advantages` is 0.
        Judged on the finished rollout, before the trainer's own checks (`refuse_untrainable`)."""
        valid = self._valid()
        rewards = [_turn_rewards(t) if self.step_level else float(t.trajectory_reward) for t in valid]
        return len(rewards) < 2 or all(r == rewards[0] for r in rewards)

    @property
    def idle(self) -> bool:
        """Not failed, yet trains nothing: `constant`, or with `overlong_filter` every valid sample was cut by a
        length limit (`is_overlong`: the filter keeps each out of the loss). Dynamic sampling leaves it out."""
        if self.failed:
            return False
        return self.constant or (self.overlong_filter and all(is_overlong(t) for t in self._valid()))

    @property
    def useful(self) -> bool:
        """Some sample enters the loss with a non-zero advantage: what dynamic sampling fills a step with."""
        return not self.failed and not self.idle

    def _valid(self) -> list[Trajectory]:
        """Finished samples that enter the group's statistics (`exclusion_reason` None)."""
        return [t for t in self.samples if exclusion_reason(t) is None]


def _turn_rewards(trajectory: Trajectory) -> tuple[float, ...]:
    """A trajectory's per-turn rewards as step-level training reads them (`step_rewards`), without trailing zeros
    (its `trajectory_reward` alone if it has no steps)."""
    if not getattr(trajectory, "steps", None):
        return (float(trajectory.trajectory_reward),)
    rewards = [float(r) for r in step_rewards(trajectory)]  # type: ignore[arg-type]
    while rewards and rewards[-1] == 0.0:
        rewards.pop()
    return tuple(rewards)


def flatten_groups(groups: Sequence[TrajectoryGroup]) -> tuple[list[Trajectory], list[int]]:
    """The finished samples of `groups` in order, and the group of each: its group's position in `groups` (the
    GRPO groups of a step are its task positions)."""
    trajectories = [t for g in groups for t in g.samples]
    group_ids = [i for i, g in enumerate(groups) for _ in g.samples]
    return trajectories, group_ids
