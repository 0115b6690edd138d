"""Detect code that blocks the event loop while a rollout runs.

A bound such as `env_timeout_s` cancels code that awaits; it cannot interrupt code that blocks the loop itself
(`time.sleep`, blocking I/O or heavy computing inside an `async def` reset or step). Such code stalls every
trajectory of the rollout. `watch_loop_lag` runs beside a rollout, sleeps a short interval at a time and compares
the time that actually passed with the interval: when the loop was late by more than a threshold, it logs a
warning naming the environment and the fix (run blocking work in a worker thread), then stops watching. It warns
once per environment class and process: a training run, which rolls out a batch per step, warns at its first.
"""

from __future__ import annotations

import logging
import time

import anyio

__all__ = ["LAG_INTERVAL_S", "LAG_THRESHOLD_S", "watch_loop_lag"]

logger = logging.getLogger(__name__)

LAG_INTERVAL_S = 0.25
"""Seconds between two looks at the loop."""

LAG_THRESHOLD_S = 1.0
"""Seconds the loop may be late before `watch_loop_lag` warns."""

_warned: set[str] = set()  # the environments warned about in this process


async def watch_loop_lag(
    environment_name: str, *, interval_s: float = LAG_INTERVAL_S, threshold_s: float = LAG_THRESHOLD_S
) -> float | None:
    """Watch the running event loop until cancelled; warn if it was blocked for more than `threshold_s`, once per
    `environment_name` and process (an environment already warned about is not watched again).

    Args:
        environment_name: the class of the rollout's environment, named in the warning.
        interval_s: seconds slept between two looks.
        threshold_s: lag (seconds late beyond `interval_s`) that counts as a blocked loop.

    Returns:
        The lag that was warned about (the watch ends after its one warning); None at once for an environment already
        warned about; it runs until cancelled otherwise. Cancelled just after the loop was blocked (the last
        trajectory ended right after the blocking call), it still warns before the cancellation goes on.
    """
    while environment_name not in _warned:
        start = time.monotonic()
        try:
            await anyio.sleep(interval_s)
        finally:  # cancelled too (the rollout's last trajectory ended right after a block): the block still counts
            lag = time.monotonic() - start - interval_s
            if lag > threshold_s:
                _warn(environment_name, lag)
        if lag > threshold_s:
            return lag
    return None


def _warn(environment_name: str, lag: float) -> None:
    """Log the warning about `environment_name` blocking the loop for `lag` seconds, once per process."""
    logger.warning(
        "the event loop was blocked for %.1f s while a rollout of environment %s ran: code that blocks it "
        "(time.sleep, blocking I/O or long computing inside an async def reset/step, a tool or a reward) "
        "stalls every trajectory and no timeout can interrupt it; run blocking work in a worker thread: "
        "`await anyio.to_thread.run_sync(...)`",
        lag,
        environment_name,
    )
    _warned.add(environment_name)
