"""Worker processes for reward code that may never return: a hard wall-clock bound per call.

A thread cannot be stopped, and math-verify's own timeouts rest on `signal.alarm`, which works only in a process's
main thread. So the code of a reward that may run away (math-verify on an answer such as
`\\boxed{2^{2^{2^{2^{2^{2}}}}}}`) runs in a small pool of persistent worker processes (`rewards/worker.py`, started by
path: no `agentic_rl`, no torch, about a second to start). A call past its bound kills its worker, which is replaced
on a later call; the other workers, and the calls they serve, go on untouched.

`RewardProcessPool.call` blocks: call it from a worker thread (the harness runs rewards in one). It is thread-safe,
and any number of threads may wait on one pool: they are served as workers become free.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError, RewardError
from agentic_rl.rewards.worker import read_frame, write_frame

__all__ = ["DEFAULT_WORKERS", "ProcessReward", "RewardProcessPool", "math_verify_pool", "shared_pool"]

DEFAULT_WORKERS = max(2, min(4, os.cpu_count() or 1))
"""Worker processes of a pool by default: a hung worker leaves at least one other free."""

WORKER_PROGRAM = Path(__file__).with_name("worker.py")


class _Worker:
    """One worker process and its two protocol pipes."""

    def __init__(self, preload: Sequence[str], start_timeout_s: float) -> None:
        config = json.dumps({"sys_path": list(sys.path), "preload": list(preload)})
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER_PROGRAM), config], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.requests, self.replies = self.process.stdin.fileno(), self.process.stdout.fileno()
        try:
            self._reply(start_timeout_s, "start")
        except BaseException:
            self.kill()
            raise

    def request(self, target: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """Run `target(*args)` in the worker; past `timeout_s` seconds (or if it dies) the worker is killed.

        Raises:
            RewardError: on a timeout, a dead worker, or an exception raised by `target` (its type and message).
        """
        try:
            write_frame(self.requests, (target, args))
        except OSError as exc:
            self.kill()
            raise RewardError(f"the reward worker process is gone ({exc})") from None
        kind, *value = self._reply(timeout_s, target)
        if kind == "error":
            raise RewardError(value[0])
        return value[0]

    def _reply(self, timeout_s: float, what: str) -> tuple[Any, ...]:
        """The next frame from the worker, waited for at most `timeout_s` seconds.

        Raises:
            RewardError: past `timeout_s` (the worker is killed) or when the worker died.
        """
        poller = select.poll()  # not select.select: a busy process may hold file descriptors past FD_SETSIZE
        poller.register(self.replies, select.POLLIN)
        if not poller.poll(max(0, math.ceil(timeout_s * 1000))):
            self.kill()
            raise RewardError(f"{what} did not finish within {timeout_s:g} s (its worker process was killed)")
        try:
            return read_frame(self.replies)
        except EOFError:
            code = self.kill()
            raise RewardError(f"the reward worker process exited with code {code} during {what}") from None

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.poll() is None

    def kill(self) -> int | None:
        """Kill the process (if it still runs), reap it and close the pipes; returns its exit code."""
        if self.process.poll() is None:
            self.process.kill()
        code = self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        return code


class RewardProcessPool:
    """Up to `max_workers` persistent worker processes, started on demand, that run scorers with a hard bound.

    Args:
        preload: modules each worker imports before its first call (their import time is not part of any
            call's bound), e.g. `("math_verify",)` or a user reward's module.
        max_workers: most worker processes at once; a call waits for a free one.
        start_timeout_s: most seconds a worker may take to start and import `preload`.
    """

    def __init__(
        self, preload: Sequence[str] = (), *, max_workers: int = DEFAULT_WORKERS, start_timeout_s: float = 120.0
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.preload = tuple(preload)
        self.max_workers = max_workers
        self.start_timeout_s = start_timeout_s
        self._free = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._live = 0  # idle + busy workers, and those starting
        self._closed = False

    def call(self, target: str, args: tuple[Any, ...], *, timeout_s: float) -> Any:
        """`target(*args)` in a worker process, bounded by `timeout_s` seconds of its run (a wait for a free worker
        is bounded by the calls ahead of it).

        Args:
            target: a scorer of `rewards.worker` (e.g. `"math_verify"`) or `"package.module:function"`.
            args: its positional arguments (picklable).
            timeout_s: most seconds the call may run; past it its worker is killed, and replaced on a later call.

        Returns:
            What `target` returned.

        Raises:
            RewardError: past the bound, when the worker died or could not start, when the pool is closed, or with
                the type and message of an exception `target` raised.
        """
        worker = self._acquire()
        try:
            return worker.request(target, args, timeout_s)
        finally:
            self._release(worker)

    @property
    def live_workers(self) -> int:
        """Worker processes started and not yet killed (busy, idle or starting)."""
        with self._free:
            return self._live

    def close(self) -> None:
        """Kill every worker: the calls in flight raise `RewardError`, and so do later calls."""
        with self._free:
            self._closed, idle, self._idle = True, self._idle, []
            self._live -= len(idle)
            busy = list(self._busy)
            self._free.notify_all()
        for worker in idle:
            worker.kill()
        for worker in busy:  # its caller's thread reaps it and closes its pipes
            worker.process.kill()

    def _acquire(self) -> _Worker:
        """An idle worker, or a new one while fewer than `max_workers` live; else wait for one to be released."""
        with self._free:
            while True:
                if self._closed:
                    raise RewardError("the reward worker pool is closed")
                if self._idle:
                    worker = self._idle.pop()
                    self._busy.add(worker)
                    return worker
                if self._live < self.max_workers:
                    self._live += 1
                    break
                self._free.wait()
        try:
            worker = _Worker(self.preload, self.start_timeout_s)
        except BaseException as exc:
            with self._free:
                self._live -= 1
                self._free.notify()
            if isinstance(exc, OSError):
                raise RewardError(f"cannot start a reward worker process: {exc}") from exc
            raise
        with self._free:
            self._busy.add(worker)
            if self._closed:
                worker.process.kill()
        return worker

    def _release(self, worker: _Worker) -> None:
        """Back to the idle workers if it is still alive and the pool open; else it is gone (killed and reaped)."""
        keep = worker.alive
        with self._free:
            self._busy.discard(worker)
            if keep and not self._closed:
                self._idle.append(worker)
            else:
                self._live -= 1
                keep = False
            self._free.notify()
        if not keep:
            worker.kill()


_POOLS: dict[tuple[str, ...], tuple[int, RewardProcessPool]] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(preload: Sequence[str]) -> RewardProcessPool:
    """The process's pool for workers that preload `preload`, made on first use and closed at exit (a forked
    child makes its own)."""
    key = tuple(preload)
    with _POOLS_LOCK:
        pid, pool = _POOLS.get(key, (None, None))
        if pool is None or pid != os.getpid():
            pool = RewardProcessPool(key)
            _POOLS[key] = (os.getpid(), pool)
            atexit.register(pool.close)
        return pool


def math_verify_pool() -> RewardProcessPool:
    """The process's pool of math-verify workers (`math_verify_reward` scores in it)."""
    return shared_pool(("math_verify",))


class ProcessReward:
    """A reward function named `package.module:function`, run in worker processes with a hard bound.

    The harness waits for any reward at most `HarnessConfig.reward_timeout_s`, but a reward that never returns
    keeps its thread (a thread cannot be stopped). Wrapped in `ProcessReward`, the function runs in a pool of
    worker processes that import its module once (`rewards.pool.shared_pool`): past `timeout_s` its worker is
    killed and replaced, and the call raises `RewardError`. The function sees a copy of `task` and `messages` and
    the state of its own process, not of the caller's (a counter it keeps counts per worker).

    Args:
        name: `package.module:function`, importable with the caller's `sys.path`.
        timeout_s: most seconds one call may run; keep it below `reward_timeout_s`.

    Raises:
        ConfigError: if `name` is not of the form `package.module:function`.
        RewardError: from `__call__` past `timeout_s`, or with the type and message of what the function raised.
    """

    def __init__(self, name: str, *, timeout_s: float = 30.0) -> None:
        module_name, sep, attr = name.partition(":")
        if not (sep and module_name and attr):
            raise ConfigError(f"ProcessReward needs 'package.module:function', got {name!r}")
        self.name, self.module_name, self.timeout_s = name, module_name, timeout_s

    def __call__(self, task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
        args = (task, list(messages))
        return float(shared_pool((self.module_name,)).call(self.name, args, timeout_s=self.timeout_s))
