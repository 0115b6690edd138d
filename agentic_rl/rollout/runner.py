"""Run many trajectories concurrently: an anyio task group with at most `n_parallel_agents` in flight.

`run_batch` is the one place that runs a batch; `run_tasks` (a list in, a list out) and `Rollout` (which can hand
unfinished work back) are built on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio

from agentic_rl.errors import ConfigError

__all__ = ["batch_indices", "check_n_parallel_agents", "run_batch", "run_tasks"]

T = TypeVar("T")


def check_n_parallel_agents(n_parallel_agents: Any) -> int:
    """Return `n_parallel_agents` if it is an int >= 1 (not a bool).

    Raises:
        ConfigError: otherwise, naming the value.
    """
    if isinstance(n_parallel_agents, bool) or not isinstance(n_parallel_agents, int) or n_parallel_agents < 1:
        raise ConfigError(f"n_parallel_agents must be an int >= 1, got {n_parallel_agents!r}")
    return n_parallel_agents


def batch_indices(tasks: Sequence[Any], indices: Sequence[int] | None) -> list[int]:
    """Each task's batch index: `indices`, or 0, 1, ... when None.

    Raises:
        ConfigError: if `indices` is not one distinct int per task.
    """
    order = list(range(len(tasks))) if indices is None else list(indices)
    if len(order) != len(tasks) or len(set(order)) != len(order):
        raise ConfigError(f"indices must give one distinct index per task: {len(tasks)} tasks, indices {order[:10]}")
    return order


async def run_batch(
    items: Sequence[tuple[int, Any]],
    run_one: Callable[[int, Any], Awaitable[T | None]],
    *,
    n_parallel_agents: int,
    on_result: Callable[[T], None] | None = None,
    watch: Callable[[], Awaitable[Any]] | None = None,
) -> dict[int, T]:
    """Run `run_one(idx, item)` for every `(idx, item)`, at most `n_parallel_agents` at a time, in item order.

    `run_one` is expected to turn its own failures into a result (as `run_trajectory` does); an exception that
    escapes it cancels the whole batch, as structured concurrency requires. A `None` result means the item was
    handed back unfinished (see `Rollout.quiesce`): it is neither reported nor returned.

    `watch`, when given, runs beside the items (e.g. `loop_lag.watch_loop_lag`) and is cancelled when the last
    item ends; it must not raise.

    Returns:
        `{idx: result}` for every item that produced a result.

    Raises:
        ConfigError: if `n_parallel_agents` is not an int >= 1.
    """
    limiter = anyio.CapacityLimiter(check_n_parallel_agents(n_parallel_agents))
    results: dict[int, T] = {}
    watching = anyio.CancelScope()  # cancelled when the last item ends
    left = len(items)

    async def watcher(watch: Callable[[], Awaitable[Any]]) -> None:
        with watching:
            await watch()

    async def worker(idx: int, item: Any) -> None:
        nonlocal left
        try:
            async with limiter:
                result = await run_one(idx, item)
        finally:
            left -= 1
            if left == 0:
                watching.cancel()
        if result is None:
            return
        results[idx] = result
        if on_result is not None:
            on_result(result)

    async with anyio.create_task_group() as tg:
        if watch is not None and items:
            tg.start_soon(watcher, watch)
        for idx, item in items:
            tg.start_soon(worker, idx, item)
    return results


async def run_tasks(
    tasks: Sequence[Any],
    run_one: Callable[[Any, int], Awaitable[T]],
    *,
    n_parallel_agents: int,
    on_result: Callable[[T], None] | None = None,
    indices: Sequence[int] | None = None,
) -> list[T]:
    """Run `run_one(task, idx)` for every task, at most `n_parallel_agents` at a time.

    Args:
        tasks: the inputs, in order.
        run_one: coroutine function producing one result (never None); see `run_batch` for failures.
        n_parallel_agents: concurrency cap.
        on_result: called with each result as it finishes (e.g. a progress bar).
        indices: the `idx` of each task (default 0, 1, ...): a run that continues an interrupted one passes the
            positions its remaining tasks had.

    Returns:
        The results in input order.

    Raises:
        ConfigError: if `n_parallel_agents` is not an int >= 1, or `indices` is not one distinct int per task.
    """
    order = batch_indices(tasks, indices)

    async def one(idx: int, task: Any) -> T:
        return await run_one(task, idx)

    items = list(zip(order, tasks, strict=True))
    results = await run_batch(items, one, n_parallel_agents=n_parallel_agents, on_result=on_result)
    return [results[idx] for idx in order]
