"""What a reward is: `reward_fn(task, messages) -> float`, and a reward that carries per-trajectory metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["RewardCallable", "RewardWithMetrics"]

RewardCallable = Callable[[dict[str, Any], Sequence[dict[str, str]]], float]
"""`reward_fn(task, messages) -> float`: the reward of a finished trajectory's final answer."""


class RewardWithMetrics(float):
    """A reward (a `float`) that carries per-trajectory metrics: the harness adds `metrics` to the trajectory's
    `metrics` (e.g. the LLM judge's `judge_failures`, an F1 reported beside the reward). Everything else reads it as
    the plain number.

    Args:
        value: the reward.
        metrics: metric name -> number (floats or ints; JSON-serializable).
    """

    metrics: dict[str, float]

    def __new__(cls, value: float, metrics: Mapping[str, float] | None = None) -> RewardWithMetrics:
        reward = super().__new__(cls, value)
        reward.metrics = dict(metrics or {})
        return reward
