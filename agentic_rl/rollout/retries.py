"""Which trajectory failures lie outside the policy, and the retry decision the turn loop makes for them.

A trajectory that failed for an infrastructure reason (`types.FailureKind`: the engine, a tool's service, an
environment call past its bound, the reward) says nothing about the policy: training it as a reward of 0 would teach
the policy that the task is hard. `run_trajectory` rolls it out again with a fresh sample, at most
`HarnessConfig.max_retries` times, and counts every retry by kind in the trajectory's metrics (`retries`,
`retries_<kind>`). One that still fails keeps its kind (`Trajectory.failure_kind`) and is left out of training, its
group trained on the samples it has.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.environments.base import INFRASTRUCTURE_ERRORS_KEY
from agentic_rl.errors import EngineError, EnvTimeoutError, RewardError, ToolUnavailableError, TrajectoryError
from agentic_rl.types import FailureKind, Trajectory

__all__ = ["failure_counts", "failure_kind", "retry_counts", "tool_failure"]

logger = logging.getLogger(__name__)


def failure_kind(exc: BaseException, *, rewarding: bool = False) -> FailureKind | None:
    """The infrastructure kind of the exception that failed a trajectory, None when the policy or the task caused it.

    Args:
        exc: what ended the trajectory.
        rewarding: True when it came from scoring the answer (any exception of the reward, e.g. a judge endpoint's
            error or a timeout, is the reward's: `FailureKind.REWARD`).
    """
    if rewarding or isinstance(exc, RewardError):
        return FailureKind.REWARD
    if isinstance(exc, EngineError | TrajectoryError):  # TrajectoryError: the engine reported a non-finite logprob
        return FailureKind.ENGINE
    if isinstance(exc, ToolUnavailableError):
        return FailureKind.TOOL
    if isinstance(exc, EnvTimeoutError):
        return FailureKind.ENVIRONMENT
    return None


def tool_failure(info: Mapping[str, Any]) -> ToolUnavailableError | None:
    """The `ToolUnavailableError` a step's `info` reports (`INFRASTRUCTURE_ERRORS_KEY`: a list of messages, or one
    message), None when it reports none."""
    problems = info.get(INFRASTRUCTURE_ERRORS_KEY)
    if not problems:
        return None
    if isinstance(problems, str):
        problems = [problems]
    return ToolUnavailableError("; ".join(str(p) for p in problems))


def retry_counts(retries: Mapping[str, int]) -> dict[str, int]:
    """The metrics of a trajectory's retries: `retries` (all of them) and `retries_<kind>` for each kind retried."""
    return {"retries": sum(retries.values()), **{f"retries_{kind}": n for kind, n in retries.items()}}


def failure_counts(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Per `FailureKind`, over `trajectories`: `failed_<kind>`, those that still failed for it after their retries,
    and `retries_<kind>`, the retries it caused (a trajectory's `metrics["retries_<kind>"]`); every kind present,
    0 when none."""
    counts = {f"failed_{kind}": 0 for kind in FailureKind} | {f"retries_{kind}": 0 for kind in FailureKind}
    for t in trajectories:
        if t.failed and t.failure_kind is not None:
            counts[f"failed_{t.failure_kind}"] = counts.get(f"failed_{t.failure_kind}", 0) + 1
        for kind in FailureKind:
            counts[f"retries_{kind}"] += int(t.metrics.get(f"retries_{kind}", 0))
    return counts
