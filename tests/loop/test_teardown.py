"""Closing what a run started never hangs or raises: a rollout whose `aclose` raises or never returns is logged and
left, and the engine is closed after it all the same."""

from __future__ import annotations

import anyio

from agentic_rl.loop.setup import close_engine, close_rollout


class _Rollout:
    """A rollout whose `aclose` raises (`hang=False`) or waits forever (`hang=True`)."""

    def __init__(self, *, hang: bool) -> None:
        self.hang = hang
        self.entered = anyio.Event()

    async def aclose(self) -> None:
        self.entered.set()
        if self.hang:
            await anyio.sleep_forever()
        raise RuntimeError("environment cannot close")


class _Engine:
    def __init__(self, *, fails: bool = False) -> None:
        self.fails = fails
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        if self.fails:
            raise RuntimeError("engine cannot close")


async def test_a_rollout_that_fails_to_close_is_logged_and_the_engine_still_closes(caplog):
    engine = _Engine()
    await close_rollout(_Rollout(hang=False))
    await close_engine(engine)
    assert engine.closed
    assert "_Rollout.aclose() failed (ignored)" in caplog.text and "environment cannot close" in caplog.text


async def test_a_rollout_that_never_closes_is_left_after_its_time_and_the_engine_still_closes(caplog):
    rollout, engine = _Rollout(hang=True), _Engine(fails=True)
    await close_rollout(rollout, timeout_s=0.05)
    assert rollout.entered.is_set()
    await close_engine(engine)  # logs, never raises
    assert engine.closed
    assert "_Rollout.aclose() did not finish within 0.05 s" in caplog.text and "closing the engine failed" in caplog.text


async def test_closing_is_shielded_from_the_cancellation_of_a_failed_run():
    engine = _Engine()
    with anyio.CancelScope() as scope:
        scope.cancel()  # the run's own scope is cancelled: teardown still runs to its end
        await close_rollout(_Rollout(hang=False))
        await close_engine(engine)
    assert engine.closed
