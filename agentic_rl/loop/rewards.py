"""A training run's reward function (`TrainConfig.reward`, the LLM judge of `TrainConfig.judge`, the
`reward_metrics` reported beside it) and the per-step figures of those metrics.

`agentic_rl.loop` resolves the names before its engine starts (`check_reward`, a `RewardPlan`), builds the reward
from them once the engine runs (`build_reward`: the in-process judge asks that engine) and adds `reward_figures` to
each metrics row and to each held-out evaluation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import JudgeSection, TrainConfig

__all__ = [
    "JUDGE",
    "JUDGE_COUNTS",
    "RewardPlan",
    "build_reward",
    "check_reward",
    "reward_figures",
    "reward_keys",
    "task_stderr_figures",
    "train_reward",
]

JUDGE = "llm_judge"
"""The reward name that asks an LLM judge (`TrainConfig.judge`)."""

JUDGE_COUNTS = ("judge_calls", "judge_failures")
"""Per-trajectory judge counts (`LLMJudgeReward`), summed in the metrics rows."""


@dataclass(frozen=True, slots=True)
class RewardPlan:
    """A run's reward, its names resolved before any engine starts (`check_reward`).

    Attributes:
        reward_fn: the reward function `TrainConfig.reward` names; None for the LLM judge, built once the engine runs.
        metrics: the function of each name of `TrainConfig.reward_metrics`, reported beside the reward.
        judge: the judge's settings (`TrainConfig.judge`).
        api_key: the judge's API key, read from `judge.api_key_env` (None: none).
    """

    reward_fn: Any | None
    metrics: Mapping[str, Any]
    judge: JudgeSection
    api_key: str | None


def check_reward(config: TrainConfig) -> RewardPlan | None:
    """Resolve the reward and metric names before any engine starts, and read the judge's API key variable.

    Returns:
        The resolved names (None with an agent of your own: it brings its reward).

    Raises:
        ConfigError: naming the unknown reward or metric, the unset API key variable, or a function of your own
            that cannot be called as `reward_fn(task, messages)` (`rollout.contracts.check_reward`).
    """
    from agentic_rl.rewards.registry import resolve_metric, resolve_reward
    from agentic_rl.rollout.contracts import check_reward as check_callable

    if config.agent is not None:
        return None
    reward_fn = resolve_reward(config.reward, also=[JUDGE]) if config.reward != JUDGE else None
    if reward_fn is not None:
        check_callable(reward_fn, what="reward", path=config.reward if ":" in config.reward else None)
    metrics = {}
    for i, name in enumerate(config.reward_metrics):
        try:
            metrics[name] = resolve_metric(name)
        except ConfigError as exc:
            raise ConfigError(f"TrainConfig.reward_metrics: {exc}") from None
        check_callable(metrics[name], what=f"reward_metrics[{i}]", path=name if ":" in name else None)
    return RewardPlan(reward_fn=reward_fn, metrics=metrics, judge=config.judge, api_key=_api_key(config))


def _api_key(config: TrainConfig) -> str | None:
    variable = config.judge.api_key_env
    if config.reward != JUDGE or variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise ConfigError(f"TrainConfig.judge.api_key_env={variable!r}: the environment variable is not set")
    return key


def train_reward(config: TrainConfig, engine: Any, renderer: Any) -> Any:
    """The run's `reward_fn(task, messages)`: `build_reward(check_reward(config), engine, renderer)`.

    Raises:
        ConfigError: for an unknown reward or metric name, or an unset API key variable.
    """
    return build_reward(check_reward(config), engine, renderer)


def build_reward(plan: RewardPlan | None, engine: Any, renderer: Any) -> Any:
    """The run's `reward_fn(task, messages)` from its resolved names: the named reward (for `llm_judge`: the judge of
    `plan.judge` from `rewards.build_judge`, over `judge.base_url`, else over `engine` in process, failures scored 0
    and counted), wrapped in a `MetricsReward` when `plan.metrics` names metrics; None without a plan (an agent of
    your own brings its reward)."""
    from agentic_rl.rewards.judge import build_judge
    from agentic_rl.rewards.registry import MetricsReward

    if plan is None:
        return None
    reward_fn = plan.reward_fn
    if reward_fn is None:
        judge = plan.judge
        reward_fn = build_judge(
            base_url=judge.base_url,
            model=judge.model,
            api_key=plan.api_key,
            timeout_s=judge.timeout_s,
            max_retries=judge.max_retries,
            max_tokens=judge.max_tokens,
            on_failure="zero",
            engine=engine,
            renderer=renderer,
        )
    if not plan.metrics:
        return reward_fn
    return MetricsReward(reward_fn, dict(plan.metrics))


def reward_keys(config: TrainConfig) -> list[str]:
    """The metrics keys `reward_figures` gives for `config`: the judge's counts, then the reported metrics."""
    return [*(JUDGE_COUNTS if config.reward == JUDGE and config.agent is None else ()), *config.reward_metrics]


def reward_figures(dist: Any, trajectories: Sequence[Any], keys: Sequence[str], *, prefix: str = "") -> dict[str, Any]:
    """Each of `keys` over `trajectories` of every rank: a judge count (`JUDGE_COUNTS`) summed, any other metric
    averaged over the trajectories that recorded it (None when none did, e.g. every reward failed).

    Args:
        dist: the run's `DistContext` (gathers in the same order on every rank).
        trajectories: this rank's trajectories.
        keys: `reward_keys(config)`.
        prefix: put before each key (`heldout_` in evaluation).

    Returns:
        `{prefix + key: int | float | None}`.
    """
    local: list[float] = []
    for key in keys:
        values = [float(t.metrics[key]) for t in trajectories if key in t.metrics]
        local += [sum(values), float(len(values))]
    ranks = dist.gather_floats(local) if local else []
    figures: dict[str, Any] = {}
    for i, key in enumerate(keys):
        total, count = sum(r[2 * i] for r in ranks), sum(r[2 * i + 1] for r in ranks)
        figures[prefix + key] = int(total) if key in JUDGE_COUNTS else (total / count if count else None)
    return figures


def task_stderr_figures(
    dist: Any, trajectories: Sequence[Any], keys: Sequence[str], samples: int, *, prefix: str = "heldout_"
) -> dict[str, float | None]:
    """The standard error of each averaged metric of `keys` (not the judge's counts) over the tasks of every rank:
    each task's mean over its `samples` consecutive trajectories (task-major, as the held-out evaluation runs them;
    those that recorded the metric), then the sample standard deviation of the task means / sqrt(tasks). The K
    samples of a task are not independent, so the task, not the trajectory, is the unit.

    Returns:
        `{prefix + key + "_stderr": float | None}` (None with fewer than 2 tasks that recorded the metric).
    """
    from agentic_rl.loop.metrics import standard_error

    averaged = [key for key in keys if key not in JUDGE_COUNTS]
    local: list[float] = []
    for key in averaged:
        means = []
        for start in range(0, len(trajectories), samples):
            values = [float(t.metrics[key]) for t in trajectories[start : start + samples] if key in t.metrics]
            if values:
                means.append(sum(values) / len(values))
        local += [float(len(means)), sum(means), sum(m * m for m in means)]
    ranks = dist.gather_floats(local) if local else []
    figures: dict[str, float | None] = {}
    for i, key in enumerate(averaged):
        count, total, squares = (sum(r[3 * i + j] for r in ranks) for j in range(3))
        figures[f"{prefix}{key}_stderr"] = standard_error(count, total, squares)
    return figures
