"""Rewards by name (`REWARDS`, `resolve_reward`), and `MetricsReward`, which reports other rewards beside one."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.rewards.base import RewardCallable, RewardWithMetrics, call_reward
from agentic_rl.rewards.math import gsm8k_reward, has_number_reward, math_reward
from agentic_rl.rewards.qa import hotpotqa_em_reward, hotpotqa_f1_reward, hotpotqa_short_f1_reward
from agentic_rl.rewards.research import RESEARCH_METRICS
from agentic_rl.rewards.workspace import workspace_tests_reward

__all__ = ["METRICS", "REWARDS", "MetricsReward", "resolve_metric", "resolve_reward"]

logger = logging.getLogger(__name__)


class MetricsReward:
    """A reward that also reports other reward functions as metrics (reported, not rewarded): each call returns a
    `RewardWithMetrics` with the reward's own metrics (if any) and one metric per `metrics` entry, e.g.
    `MetricsReward(judge, {"hotpotqa_f1": hotpotqa_f1_reward})`.

    An async reward (`async def __call__`): the reward and each metric are run as the harness runs a reward
    (`call_reward`: an async one awaited, a sync one in a worker thread), one after the other. From synchronous
    code, call it with `anyio.run(reward, task, messages)`.

    A metric function that raises is left out of that trajectory's metrics (logged); the reward's own error
    propagates.

    Args:
        reward_fn: the reward, sync or async.
        metrics: metric name -> `fn(task, messages) -> float`, sync or async.
    """

    def __init__(self, reward_fn: RewardCallable, metrics: Mapping[str, RewardCallable]) -> None:
        self.reward_fn, self.metrics = reward_fn, dict(metrics)

    async def __call__(self, task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
        reward = await call_reward(self.reward_fn, task, messages)
        values = dict(getattr(reward, "metrics", None) or {})
        for name, fn in self.metrics.items():
            try:
                values[name] = float(await call_reward(fn, task, messages))
            except Exception as exc:  # e.g. a task without a ground truth
                logger.warning("metric %s failed: %s: %s", name, type(exc).__name__, exc)
        return RewardWithMetrics(float(reward), values)


REWARDS = {
    "gsm8k": gsm8k_reward,
    "has_number": has_number_reward,
    "math": math_reward,
    "hotpotqa_f1": hotpotqa_f1_reward,
    "hotpotqa_em": hotpotqa_em_reward,
    "hotpotqa_short_f1": hotpotqa_short_f1_reward,
    "workspace_tests": workspace_tests_reward,  # a coding task's tests in its workspace (WorkspaceEnvironment)
}


METRICS = {**REWARDS, **RESEARCH_METRICS}
"""What `TrainConfig.reward_metrics` may name besides `package.module:function`: every reward, and diagnostics that
are reported, never rewarded (`rewards.research`)."""


def resolve_metric(name: str) -> RewardCallable:
    """A metric function by name: a key of `METRICS`, or `package.module:function` (`resolve_reward`).

    Raises:
        ConfigError: if the name is unknown or the import fails.
    """
    if name in METRICS:
        return METRICS[name]
    return resolve_reward(name, also=sorted(set(METRICS) - set(REWARDS)))


def resolve_reward(name: str, *, also: Sequence[str] = ()) -> RewardCallable:
    """A reward function by name: a key of `REWARDS`, or `package.module:function`.

    Args:
        name: the reward's name.
        also: other names the caller accepts itself (e.g. the CLI's `llm_judge`), listed in the error.

    Raises:
        ConfigError: if the name is unknown or the import fails.
    """
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        names = sorted([*REWARDS, *also])
        raise ConfigError(f"unknown reward {name!r}: use one of {names} or 'package.module:function'")
    from agentic_rl.plugins import load_object

    fn = load_object(name, what="reward")  # as environments, tools and agents: also from the current directory
    if not callable(fn):
        raise ConfigError(f"reward {name!r} is not callable")
    return fn
