"""Reading back what a rollout wrote as each trajectory finished (`trajectories.jsonl`), to continue it.

A rollout appends one `trajectory_to_dict` record per line, written whole and flushed as each trajectory ends, so a
process killed at any moment leaves complete records plus at most one half-written last line. `finished_records`
drops that line and says which tasks are done: a task is known by its batch index (`idx`, its position in the task
list, which also seeds its sampling) and its task id, and both must match the task list being continued.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from agentic_rl.data import drop_partial_line, iter_jsonl
from agentic_rl.errors import ConfigError

__all__ = ["finished_records"]


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
