"""Bounded awaits of code the turn loop does not own: engine requests, environment calls and closes.

Every await of user code in a rollout goes through one of these, so that a call that never returns fails (or, for
a close, only delays) its own trajectory instead of hanging the group and the run. A bound cancels the awaited
coroutine; code that blocks the event loop itself (`time.sleep` in an `async def`) cannot be bounded this way
(see `agentic_rl.rollout.loop_lag`, which warns about it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from agentic_rl.engine.base import Engine, Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Environment, Sample
from agentic_rl.errors import EngineTimeoutError, EnvTimeoutError

__all__ = ["close_quietly", "close_sample", "env_call", "generate_within"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def generate_within(engine: Engine, prompt: list[int], sampling: SamplingConfig, timeout_s: float) -> Generation:
    """`engine.generate(prompt, sampling)`, aborted (by cancellation) past `timeout_s` seconds.

    Raises:
        EngineTimeoutError: past `timeout_s` (named as `turn_timeout_s`); else what the engine raised.
    """
    with anyio.move_on_after(timeout_s):
        return await engine.generate(prompt, sampling)
    raise EngineTimeoutError(f"engine request did not return within turn_timeout_s={timeout_s:g}; it was aborted")


async def env_call(environment: Environment, method: str, argument: Any, timeout_s: float) -> Any:
    """`environment.<method>(argument)` (`reset` or `step`), cancelled past `timeout_s` seconds.

    Raises:
        EnvTimeoutError: past `timeout_s`, naming the call and the bound (`env_timeout_s`); else what the call
            raised.
    """
    with anyio.move_on_after(timeout_s):
        return await getattr(environment, method)(argument)
    raise EnvTimeoutError(
        f"environment.{method} did not return within env_timeout_s={timeout_s:g} "
        f"({type(environment).__qualname__}); it was cancelled"
    )


async def close_sample(environment: Environment, sample: Sample, idx: int, timeout_s: float) -> str | None:
    """`environment.close(sample)` of trajectory `idx`: shielded from cancellation, bounded by `timeout_s`.

    Returns:
        None when it closed in time, else what went wrong (also logged). Never raises but for a cancellation
        pending from outside, delivered after the close.
    """
    error = None
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s) as scope:
        try:
            await environment.close(sample)
        except Exception as exc:
            logger.exception("environment.close failed for trajectory %s", idx)
            error = f"environment.close failed: {type(exc).__name__}: {exc}"
    if scope.cancelled_caught:
        logger.error("environment.close of trajectory %s did not finish within %g s", idx, timeout_s)
        error = f"environment.close did not finish within close_timeout_s={timeout_s:g}"
    return error


async def close_quietly(close: Callable[[], Awaitable[Any]], timeout_s: float) -> bool:
    """Await `close()` (a bound method such as `environment.aclose`) at the end of a run: shielded from
    cancellation, bounded by `timeout_s`; a timeout or an exception is logged as a warning naming the class and the
    method, never raised, so that it neither fails a finished run nor masks the error of a failing one.

    Returns:
        True when it returned in time without an error.
    """
    owner = getattr(close, "__self__", None)
    name = f"{type(owner).__qualname__}.{getattr(close, '__name__', 'close')}" if owner is not None else repr(close)
    ok = False
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s) as scope:
        try:
            await close()
            ok = True
        except Exception as exc:
            logger.warning("%s() failed (ignored): %s: %s", name, type(exc).__name__, exc, exc_info=True)
    if scope.cancelled_caught:
        logger.warning("%s() did not finish within %g s (ignored; it may have leaked resources)", name, timeout_s)
    return ok
