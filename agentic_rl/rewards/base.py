"""What a reward is: `reward_fn(task, messages) -> float`, sync or `async def`, and a reward that carries
per-trajectory metrics; `call_reward` runs either kind as the harness does."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from agentic_rl.errors import RewardError

__all__ = ["RewardCallable", "RewardWithMetrics", "call_reward", "is_async_reward", "score_answer"]

RewardCallable = Callable[[dict[str, Any], Sequence[dict[str, str]]], float | Awaitable[float]]
"""`reward_fn(task, messages) -> float`: the reward of a finished trajectory's final answer.

A reward is either a plain function (or callable object) or an `async def` one (a coroutine function, or an object
whose `__call__` is `async def`). The harness (`call_reward`) awaits an async reward on its own event loop, so a
reward that asks a model (the in-process LLM judge over `EngineChatClient`) awaits the engine like any turn; it runs
a sync reward in a worker thread, so blocking work (math-verify, an HTTP call) never stalls the loop. Either kind is
waited for at most `HarnessConfig.reward_timeout_s` seconds. A sync reward that returns an awaitable has it awaited
too. The value may be a `RewardWithMetrics`.
"""


def is_async_reward(reward_fn: Callable[..., Any]) -> bool:
    """Whether `reward_fn` is an `async def` reward: a coroutine function (also behind `functools.partial` or a bound
    method) or an object whose `__call__` is one."""
    if inspect.iscoroutinefunction(reward_fn):
        return True
    return callable(reward_fn) and inspect.iscoroutinefunction(type(reward_fn).__call__)


async def call_reward(reward_fn: RewardCallable, task: dict[str, Any], messages: Sequence[dict[str, Any]]) -> Any:
    """What `reward_fn(task, messages)` returns: an async reward awaited on the caller's event loop, a sync one run in
    a worker thread (abandoned when the caller is cancelled: a thread cannot be stopped), and an awaitable that a
    sync one returns awaited on the loop.

    Returns:
        The reward's value as it returned it (a float, or a `RewardWithMetrics`); not checked.
    """
    if is_async_reward(reward_fn):
        result = reward_fn(task, messages)
    else:
        result = await anyio.to_thread.run_sync(reward_fn, task, messages, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        result = await result
    return result


async def score_answer(
    reward_fn: RewardCallable,
    task: dict[str, Any],
    messages: Sequence[dict[str, Any]],
    *,
    timeout_s: float,
    metrics: dict[str, Any],
) -> float:
    """A finished trajectory's answer reward as the harness takes it: `call_reward`, waited for at most `timeout_s`
    seconds (past it an async reward is cancelled and a sync one's thread abandoned; rewards that can run away, such
    as math-verify, bound their own work in a worker process). Into `metrics` (the trajectory's) go the seconds it
    took (`reward_time`), the metrics of a `RewardWithMetrics`, and any failure (`reward_error`).

    Returns:
        The reward as a plain float.

    Raises:
        RewardError: past `timeout_s`, or if the reward is not a finite number; else what the reward raised.
    """
    t0 = time.perf_counter()
    try:
        with anyio.move_on_after(timeout_s) as scope:
            result = await call_reward(reward_fn, task, messages)
        if scope.cancelled_caught:
            raise RewardError(f"the reward did not finish within reward_timeout_s={timeout_s:g}")
        metrics.update(getattr(result, "metrics", None) or {})  # a RewardWithMetrics' own metrics
        reward = _as_reward(result)
    except Exception as exc:
        metrics["reward_error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        metrics["reward_time"] = time.perf_counter() - t0
    return reward


def _as_reward(result: Any) -> float:
    """The number a reward function returned, as a float.

    Raises:
        RewardError: for anything but a finite real number (a string, None or a bool is refused, not converted).
    """
    if result is None or isinstance(result, (bool, str, bytes)):
        raise RewardError(f"reward function returned {result!r} ({type(result).__name__}), not a number")
    try:
        reward = float(result)
    except (TypeError, ValueError) as exc:
        raise RewardError(f"reward function returned {type(result).__name__}, not a number: {exc}") from None
    if not math.isfinite(reward):
        raise RewardError(f"reward function returned {reward}")
    return reward


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
