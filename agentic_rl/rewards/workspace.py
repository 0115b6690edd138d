"""The ``workspace_tests`` reward: a coding task's tests, run in its trajectory's workspace after the episode.

Reward 1.0 when the tests pass, else 0.0: every node id of ``fail_to_pass`` and ``pass_to_pass`` passed, or, when
the task lists none, ``test_command`` exited with status 0. Reported beside it (`RewardWithMetrics`):
``tests_passed_share`` (the share of the listed tests that passed; without a list, of the test cases pytest
reported, else 1.0 / 0.0 as the reward), ``tests_run`` (test cases in pytest's report; 0 for a command that is
not pytest), ``tests_exit_status`` (the test command's exit status) and ``workspace_overlay`` (1: the workspace is
an overlay, 0: a copy).

A run that could not judge the code is an infrastructure failure, raised as `RewardError` (the harness then fails
the trajectory as a ``reward`` failure and rolls it out again; it is never trained as a reward of 0): the run passed
its time limit, was killed by a signal (the kernel's out-of-memory killer, the CPU-time or file-size limit), a test
failed with a `MemoryError` (the memory limit), or the sandbox could not start or answer.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.errors import ConfigError, RewardError, ToolError
from agentic_rl.rewards.base import RewardWithMetrics
from agentic_rl.tools.workspace import run_workspace_tests

__all__ = ["workspace_tests_reward"]

logger = logging.getLogger(__name__)


def _killed_by(returncode: int) -> str | None:
    """The signal that ended a ``bash -c`` command (a negative status, or 128 + n from the shell), or None."""
    number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode <= 128 + 64 else None
    if number is None:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def workspace_tests_reward(task: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> RewardWithMetrics:
    """Runs the task's tests in its workspace (`agentic_rl.tools.workspace.run_workspace_tests`) and scores them.

    Args:
        task: the task as `WorkspaceEnvironment.reset` returned it (with ``workspace_session``).
        messages: the conversation (not read: the workspace holds the answer).

    Returns:
        1.0 or 0.0, with ``tests_passed_share``, ``tests_run``, ``tests_exit_status`` and ``workspace_overlay``.

    Raises:
        RewardError: when the tests could not run or were killed by a limit (see the module docstring).
    """
    try:
        run = run_workspace_tests(task)
    except (ConfigError, ToolError) as exc:
        raise RewardError(f"the workspace tests could not run: {exc}") from exc
    if run.returncode is None:
        raise RewardError(f"the test run passed its time limit and was killed; its output ended: {run.tail[-500:]}")
    killer = _killed_by(run.returncode)
    if killer is not None:
        raise RewardError(
            f"the test run was killed by {killer} (a workspace limit); its output ended: {run.tail[-500:]}"
        )
    if run.memory_errors:
        raise RewardError(f"{run.memory_errors} test(s) failed with MemoryError: the sandbox's memory limit bit")
    if not run.report and run.returncode != 0 and "MemoryError" in run.tail:  # a plain command, no pytest report
        raise RewardError("the test command failed with MemoryError: the sandbox's memory limit bit")
    if run.listed:
        passed = run.listed_passed == run.listed
        share = run.listed_passed / run.listed
    else:
        passed = run.returncode == 0
        share = run.passed / run.total if run.total else float(passed)
    if not passed:
        logger.debug("workspace tests failed (status %s): %s", run.returncode, run.not_passed or run.tail[-300:])
    metrics = {
        "tests_passed_share": share,
        "tests_run": float(run.total),
        "tests_exit_status": float(run.returncode),
        "workspace_overlay": float(run.overlay),
    }
    return RewardWithMetrics(1.0 if passed else 0.0, metrics)
