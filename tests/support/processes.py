"""Driving an `agentic-rl` subprocess to a known point and killing it there, ordered by what it wrote, not by sleeps.

The runs these helpers drive use `support.toy_rewards:e_share_held` (tests/support), which blocks every reward call after the
N-th: the process then stops at a known point and stays there until killed, so "wait until the files show N results,
then kill -9" never races the process to its end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"  # support/toy_rewards.py, importable by the subprocess as `support.toy_rewards`


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: this one's, with `support.toy_rewards` importable, plus `extra`."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def cli_command(*args: str) -> list[str]:
    """`python -m agentic_rl.cli ARGS...` with this interpreter."""
    return [sys.executable, "-m", "agentic_rl.cli", *args]


def complete_lines(path: Path) -> int:
    """Lines of `path` that end with a newline (0 when it does not exist yet)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def start(command: list[str], log: Path, **extra_env: str) -> subprocess.Popen:
    """Start `command` with `cli_env(**extra_env)` in the repository root, stdout and stderr into `log` (a file, so a
    full pipe can never block the child)."""
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=cli_env(**extra_env), cwd=ROOT)


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], *, what: str, log: Path, timeout_s: float) -> None:
    """Poll `ready()` until it holds. Fails (and kills `proc`) if `proc` exits first or `timeout_s` passes.

    The poll interval only bounds how soon the state is seen; nothing depends on how long the process takes.
    """
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=60)
            raise AssertionError(f"no {what} within {timeout_s} s:\n{_tail(log)}")
        time.sleep(0.05)


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL `proc` (no handler, no cleanup runs) and reap it."""
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def run(command: list[str], *, timeout_s: float = 600, **extra_env: str) -> subprocess.CompletedProcess:
    """Run `command` to its end (bounded by `timeout_s`) and check it succeeded."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=cli_env(**extra_env), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""
