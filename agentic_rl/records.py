"""The `trajectories.jsonl` record format: writing a trajectory as one JSON line, reading it back, and resuming.

A record (`trajectory_to_dict`) holds a trajectory's token runs, chat, reward, metrics and outcome; `write_trajectories`
writes a list of them, and `trajectory_from_dict` reads one back. A rollout appends one record per line, written whole
and flushed as each trajectory ends, so a process killed at any moment leaves complete records plus at most one
half-written last line. `finished_records` drops that line and says which tasks are done: a task is known by its batch
index (`idx`, its position in the task list, which also seeds its sampling) and its task id, and both must match the
task list being continued.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentic_rl.data import drop_partial_line, iter_jsonl
from agentic_rl.errors import ConfigError, TrajectoryError
from agentic_rl.types import StepTrajectory, TerminationReason, TokenRun, Trajectory

__all__ = [
    "finished_records",
    "read_trajectories",
    "trajectory_from_dict",
    "trajectory_to_dict",
    "write_trajectories",
]

_RUN_FIELDS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "weight_versions")


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    """A JSON-ready record: token ids, masks, logprobs, chat, reward, metrics and termination reason.

    The token fields hold the last run, with `weight_versions` (the engine weight version of each response token,
    -1 where inserted; None when not recorded). A trajectory of several runs also has `runs`: every run, each with
    those five fields. A `StepTrajectory` adds `task_id` and `steps` (each with its `run` index and `span`).
    """
    runs = trajectory.token_runs()
    last = runs[-1]
    record: dict[str, Any] = {
        "idx": trajectory.idx,
        "prompt_ids": trajectory.prompt_tokens.tolist(),
        "response_ids": trajectory.response_tokens.tolist(),
        "response_mask": trajectory.response_masks.tolist(),
        "response_logprobs": None if trajectory.response_logprobs is None else trajectory.response_logprobs.tolist(),
        "weight_versions": last.weight_versions,
        "chat_completions": trajectory.chat_completions,
        "trajectory_reward": trajectory.trajectory_reward,
        "metrics": trajectory.metrics,
        "termination_reason": str(trajectory.termination_reason),
        "failed": trajectory.failed,
        "error": trajectory.error,
        "failure_kind": trajectory.failure_kind,
        "refused": trajectory.refused,
    }
    if len(runs) > 1:
        record["runs"] = [{name: getattr(run, name) for name in _RUN_FIELDS} for run in runs]
    if isinstance(trajectory, StepTrajectory):
        task = trajectory.task if isinstance(trajectory.task, dict) else {"raw": repr(trajectory.task)}
        record["task_id"] = task.get("id")
        index = {id(run): k for k, run in enumerate(runs)}
        record["steps"] = [
            {
                "action": s.action,
                "thought": s.thought,
                "reward": s.reward,
                "done": s.done,
                "info": s.info,
                "run": index.get(id(s.run)),
                "span": list(s.span),
            }
            for s in trajectory.steps
        ]
    return record


def trajectory_from_dict(record: Mapping[str, Any]) -> Trajectory:
    """The `Trajectory` a `trajectory_to_dict` record holds (e.g. read back from `trajectories.jsonl`): token runs,
    chat, reward, metrics and outcome. Per-turn steps and the task are not restored.

    Raises:
        TrajectoryError: if a field is missing or the token fields are inconsistent.
    """
    try:
        runs = [TokenRun(**{name: run.get(name) for name in _RUN_FIELDS}) for run in record.get("runs") or ()]
        if not runs and record.get("weight_versions") is not None:  # one run, with its weight versions
            runs = [TokenRun(**{name: record[name] for name in _RUN_FIELDS})]
        return Trajectory(
            prompt_tokens=record["prompt_ids"],
            response_tokens=record["response_ids"],
            response_masks=record["response_mask"],
            idx=record["idx"],
            trajectory_reward=record["trajectory_reward"],
            chat_completions=record["chat_completions"],
            metrics=record["metrics"],
            response_logprobs=record["response_logprobs"],
            termination_reason=_reason(record["termination_reason"]),
            failed=record["failed"],
            error=record["error"],
            failure_kind=record.get("failure_kind"),
            refused=record.get("refused", record["metrics"].get("refused")),  # older records: in their metrics
            runs=runs,
        )
    except KeyError as exc:
        raise TrajectoryError(f"a trajectory record needs {exc.args[0]!r}") from None


def _reason(value: Any) -> Any:
    """A recorded termination reason as a `TerminationReason` where it names one (else as recorded)."""
    return TerminationReason(value) if value in _REASONS else value


_REASONS = frozenset(reason.value for reason in TerminationReason)


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """The trajectories of a `trajectories.jsonl` file (`write_trajectories`, a rollout's or a training step's
    records), in file order, as `trajectory_from_dict` restores them. The file is only read: a half-written last
    line (a process killed mid-write) is skipped, not cut.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ConfigError: naming `path:line` for a line that is not JSON or not a trajectory record.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1]:  # no newline after it: half-written
        lines[-1] = ""
    trajectories = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise TrajectoryError("a trajectory record is a JSON object")
            trajectories.append(trajectory_from_dict(record))
        except (ValueError, TrajectoryError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{path}:{lineno}: not a trajectory record: {exc}") from None
    return trajectories


def write_trajectories(
    path: str | Path, trajectories: Sequence[Trajectory], task_ids: Sequence[Any] | None = None
) -> None:
    """Write `trajectories` into `path` as JSON Lines, one `trajectory_to_dict` record each (overwriting the file); a
    record without a `task_id` gets the one at its position in `task_ids`."""
    with Path(path).open("w", encoding="utf-8") as f:
        for i, trajectory in enumerate(trajectories):
            record = trajectory_to_dict(trajectory)
            if task_ids is not None:
                record.setdefault("task_id", task_ids[i])
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def finished_records(path: str | os.PathLike[str], tasks: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """The records already in `path`, by batch index, after cutting the file back to its last complete line.

    Args:
        path: the rollout's `trajectories.jsonl` (a missing file means nothing finished).
        tasks: the full task list of the rollout being continued (record `idx` i belongs to `tasks[i]`).

    Returns:
        `{idx: record}` of every finished trajectory.

    Raises:
        ConfigError: naming `path:line` for a line that is not JSON or not a record, a record whose `idx` is not a
            position in `tasks`, a record whose `task_id` is not the id of the task at its position (the task file
            changed since the run started), or a second record of one position.
    """
    drop_partial_line(path)
    if not os.path.exists(path):
        return {}
    done: dict[int, dict[str, Any]] = {}
    for lineno, record in iter_jsonl(path):
        where = f"{path}:{lineno}"
        idx = record.get("idx") if isinstance(record, dict) else None
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ConfigError(f"{where}: not a trajectory record (no integer 'idx')")
        if not 0 <= idx < len(tasks):
            raise ConfigError(f"{where}: idx {idx} is outside the {len(tasks)} tasks of this run")
        task = tasks[idx]
        expected = task.get("id") if isinstance(task, dict) else None
        if record.get("task_id") != expected:
            raise ConfigError(
                f"{where}: the record of task {idx} has task id {record.get('task_id')!r}, but the "
                f"task file has {expected!r} there: the tasks changed since the run started"
            )
        if idx in done:
            raise ConfigError(f"{where}: a second record of task {idx} (task id {expected!r})")
        done[idx] = record
    return done
