"""Group-relative advantages (GRPO), of whole trajectories or of steps per turn index."""

from __future__ import annotations

import torch

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.packing import PackedBatch

__all__ = ["batch_advantages", "group_advantages", "turn_advantages"]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    valid: torch.Tensor,
    *,
    scale_by_std: bool = True,
    std_floor: float = 0.1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of each trajectory relative to the others of its group.

    A_i = (r_i - mean_g) / (max(std_g, std_floor) + eps), or r_i - mean_g without std scaling, where mean_g and
    std_g (population std) are taken over the valid trajectories of i's group. The floor on the std keeps
    near-constant groups from exploding: seven rewards of 0.35 and one of 0.95 give std 0.198 and advantages
    of at most 2.65 in size. A group with one valid member gets 0.

    Args:
        rewards: (B,) float, trajectory rewards.
        group_ids: (B,) int64, rows with the same id share a task.
        valid: (B,) bool; invalid rows (failed, aborted) get advantage 0 and do not enter group statistics.
        scale_by_std: divide by the (floored) group std (GRPO); False gives the mean-baseline variant
            (Dr. GRPO).
        std_floor: lower bound on the std used for scaling.
        eps: added to the denominator.

    Returns:
        (B,) float32 advantages, 0 on invalid rows.

    Raises:
        TrajectoryError: on shape mismatch or a non-finite reward on a valid row.

    Source: Shao et al. 2024, "DeepSeekMath", section 4.1.2 (outcome supervision with GRPO); Liu et al. 2025,
    "Understanding R1-Zero-Like Training" for the unscaled variant.
    """
    if not (rewards.shape == group_ids.shape == valid.shape) or rewards.dim() != 1:
        raise TrajectoryError(
            f"rewards, group_ids and valid must be equal 1-D shapes, got "
            f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, {tuple(valid.shape)}"
        )
    rewards = rewards.to(torch.float32)
    valid = valid.to(torch.bool)
    if not bool(torch.isfinite(rewards[valid]).all()):
        raise TrajectoryError("a valid trajectory has a NaN or Inf reward")
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0
    weight = valid.to(torch.float32)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    count = torch.zeros(n_groups).index_add_(0, group, weight)
    mean = torch.zeros(n_groups).index_add_(0, group, r) / count.clamp(min=1)
    centered = (r - mean[group]) * weight
    if scale_by_std:
        var = torch.zeros(n_groups).index_add_(0, group, centered**2) / count.clamp(min=1)
        centered = centered / (var.sqrt().clamp(min=std_floor)[group] + eps)
    return torch.where(count[group] > 1, centered, torch.zeros_like(centered))


def turn_advantages(
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    turns: torch.Tensor,
    valid: torch.Tensor,
    *,
    scale_by_std: bool = True,
    std_floor: float = 0.1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of each step relative to the steps of its group at the same turn index.

    The steps of a group's trajectories that share a turn index k share one mean and std: A = (G - mean_{g,k}) /
    (max(std_{g,k}, std_floor) + eps) on the steps' returns G (`group_advantages` on the cells (group, turn index));
    a cell with one valid step gets 0. Turn k of one trajectory is compared with turn k of its siblings, which
    answered the same task from the same first prompt, so the baseline of a late turn is not set by the returns of
    early turns (which, with gamma = 1, include the rewards of the turns after them).

    This is a per-turn-index baseline, a simple form of step-level grouping. GiGPO (Feng et al. 2025, "Group-in-Group
    Policy Optimization for LLM Agent Training") groups steps by identical anchor (environment) states across a
    group's trajectories and adds the step-level advantage to an episode-level one; here the step's turn index stands
    in for its state (steps at the same index have taken as many actions, but their observations may differ), and the
    step-level advantage is the only one. With one-turn trajectories and gamma = 1 it equals the trajectory-level
    `group_advantages` exactly.

    Args:
        returns: (S,) float, the steps' discounted returns (`Step.mc_return`).
        group_ids: (S,) int64, the task group of each step's trajectory.
        turns: (S,) int64, the turn index of each step in its trajectory (0 first).
        valid: (S,) bool; invalid steps get 0 and do not enter the statistics.
        scale_by_std, std_floor, eps: as `group_advantages`.

    Returns:
        (S,) float32 advantages, 0 on invalid steps and in cells of one valid step.

    Raises:
        TrajectoryError: on shape mismatch or a non-finite return on a valid step.
    """
    if not (returns.shape == group_ids.shape == turns.shape == valid.shape) or returns.dim() != 1:
        shapes = [tuple(x.shape) for x in (returns, group_ids, turns, valid)]
        raise TrajectoryError(f"returns, group_ids, turns and valid must be equal 1-D shapes, got {shapes}")
    if not returns.numel():
        return torch.zeros(0, dtype=torch.float32)
    _, cell = torch.unique(torch.stack((group_ids.long(), turns.long()), dim=1), dim=0, return_inverse=True)
    return group_advantages(returns, cell, valid, scale_by_std=scale_by_std, std_floor=std_floor, eps=eps)


def batch_advantages(batch: PackedBatch, *, scale_by_std: bool = True, std_floor: float = 0.1) -> torch.Tensor:
    """The advantage of every row of a packed batch: its trajectory's group advantage.

    Group statistics are taken over trajectories (`batch.trajectory_rewards`, `trajectory_group_ids`,
    `trajectory_valid`), not rows: a trajectory split into several runs by memory weighs once in its group's mean
    and std, and each of its runs gets the same advantage. A batch of steps (`batch.trajectory_turns` set, see
    `train.turn_rows.step_units`) takes them per group and turn index instead (`turn_advantages`).

    Returns:
        (B,) float32 on the batch's device, 0 on rows of invalid trajectories.

    Raises:
        TrajectoryError: as `group_advantages`.
    """
    if batch.trajectory_turns is not None:
        per_trajectory = turn_advantages(
            batch.trajectory_rewards.cpu(),
            batch.trajectory_group_ids.cpu(),
            batch.trajectory_turns.cpu(),
            batch.trajectory_valid.cpu(),
            scale_by_std=scale_by_std,
            std_floor=std_floor,
        )
    else:
        per_trajectory = group_advantages(
            batch.trajectory_rewards.cpu(),
            batch.trajectory_group_ids.cpu(),
            batch.trajectory_valid.cpu(),
            scale_by_std=scale_by_std,
            std_floor=std_floor,
        )
    return per_trajectory.to(batch.row_trajectory.device)[batch.row_trajectory]
