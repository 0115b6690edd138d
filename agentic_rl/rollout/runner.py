"""Run many trajectories concurrently: an anyio task group with at most `n_parallel_agents` in flight."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio

from agentic_rl.errors import ConfigError

__all__ = ["run_tasks"]

T = TypeVar("T")


async def run_tasks(
    tasks: Sequence[Any],
    run_one: Callable[[Any, int], Awaitable[T]],
    *,
    n_parallel_agents: int,
    on_result: Callable[[T], None] | None = None,
) -> list[T]:
    """Run `run_one(task, idx)` for every task, at most `n_parallel_agents` at a time.

    `run_one` is expected to turn its own failures into a result (as `run_trajectory` does); an exception that
    escapes it cancels the whole batch, as structured concurrency requires.

    Args:
        tasks: the inputs, in order.
        run_one: coroutine function producing one result.
        n_parallel_agents: concurrency cap.
        on_result: called with each result as it finishes (e.g. a progress bar).

    Returns:
        The results in input order.

    Raises:
        ConfigError: if `n_parallel_agents` is not an int >= 1.
    """
    if isinstance(n_parallel_agents, bool) or not isinstance(n_parallel_agents, int) or n_parallel_agents < 1:
        raise ConfigError(f"n_parallel_agents must be an int >= 1, got {n_parallel_agents!r}")
    limiter = anyio.CapacityLimiter(n_parallel_agents)
    results: dict[int, T] = {}

    async def worker(idx: int, task: Any) -> None:
        async with limiter:
            result = await run_one(task, idx)
        results[idx] = result
        if on_result is not None:
            on_result(result)

    async with anyio.create_task_group() as tg:
        for idx, task in enumerate(tasks):
            tg.start_soon(worker, idx, task)
    return [results[idx] for idx in range(len(tasks))]
