"""Aggregate statistics of a rollout and the JSON form of a trajectory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentic_rl.types import StepTrajectory, Trajectory

__all__ = ["summarize", "trajectory_to_dict"]


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    """A JSON-ready record: token ids, masks, logprobs, chat, reward, metrics and termination reason."""
    record: dict[str, Any] = {
        "idx": trajectory.idx,
        "prompt_ids": trajectory.prompt_tokens.tolist(),
        "response_ids": trajectory.response_tokens.tolist(),
        "response_mask": trajectory.response_masks.tolist(),
        "response_logprobs": None if trajectory.response_logprobs is None else trajectory.response_logprobs.tolist(),
        "chat_completions": trajectory.chat_completions,
        "trajectory_reward": trajectory.trajectory_reward,
        "metrics": trajectory.metrics,
        "termination_reason": trajectory.termination_reason,
        "failed": trajectory.failed,
        "error": trajectory.error,
    }
    if isinstance(trajectory, StepTrajectory):
        task = trajectory.task if isinstance(trajectory.task, dict) else {"raw": repr(trajectory.task)}
        record["task_id"] = task.get("id")
        record["steps"] = [
            {"action": s.action, "thought": s.thought, "reward": s.reward, "done": s.done, "info": s.info}
            for s in trajectory.steps
        ]
    return record


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(trajectories: Sequence[Trajectory], wall_time_s: float) -> dict[str, Any]:
    """Rollout statistics.

    Args:
        trajectories: the finished rollout.
        wall_time_s: wall-clock seconds of the whole rollout.

    Returns:
        `tasks`, `failed`, `accuracy` (share of all tasks with `res_reward > 0`), `tool_call_rate` (share of finished
        trajectories with at least one tool call), `mean_turns`, `generated_tokens`, `generated_tokens_per_s`,
        `llm_time_s` / `env_time_s` / `reward_time_s` (summed over trajectories), `alignment_mismatches`,
        `retokenize_drift`, `termination_reasons` (counts) and `wall_time_s`.
    """
    ok = [t for t in trajectories if not t.failed]
    generated = sum(t.num_generated_tokens for t in trajectories)
    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.termination_reason] = reasons.get(t.termination_reason, 0) + 1
    n = len(trajectories)
    return {
        "tasks": n,
        "failed": n - len(ok),
        "accuracy": sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories) / n if n else 0.0,
        "mean_reward": _mean([float(t.trajectory_reward) for t in ok]),
        "tool_call_rate": _mean([float(t.metrics.get("tool_calls", 0) > 0) for t in ok]),
        "mean_turns": _mean([t.metrics.get("steps", 0) for t in ok]),
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / wall_time_s if wall_time_s > 0 else 0.0,
        "llm_time_s": sum(t.metrics.get("llm_time", 0.0) for t in trajectories),
        "env_time_s": sum(t.metrics.get("env_time", 0.0) for t in trajectories),
        "reward_time_s": sum(t.metrics.get("reward_time", 0.0) for t in trajectories),
        "alignment_mismatches": sum(t.metrics.get("alignment_mismatches", 0) for t in ok),
        "retokenize_drift": sum(t.metrics.get("retokenize_drift", 0) for t in ok),
        "termination_reasons": reasons,
        "wall_time_s": wall_time_s,
    }
