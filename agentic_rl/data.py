"""Reading JSON Lines task, corpus and question files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.synthetic import parse_arithmetic_spec

__all__ = ["SHARED_DATA", "iter_jsonl", "load_tasks"]

#: The shared data folder beside the repository (`<repo>/../shared/data`): GSM8K, HotpotQA, MATH-500.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield `(line number, parsed value)` for every non-blank line of a UTF-8 JSON Lines file.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ConfigError: (a `ValueError`) naming `path:line` for a line that is not valid JSON.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc


def load_tasks(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Read tasks from JSONL: each row becomes `{"id", "question", "ground_truth", ...}`.

    `ground_truth` is taken from a `ground_truth` field, else from `answer` (GSM8K); `id` defaults to the row
    number. Rows are not validated here: a malformed row becomes a failed trajectory with a clear error.
    `path` may also be a generated task family: `arithmetic:SPLIT:COUNT[:STEPS]` (see `agentic_rl.synthetic`).

    Raises:
        FileNotFoundError: if `path` does not exist.
        ConfigError: naming the line, if a line is not JSON, or for a malformed `arithmetic:` spec.
    """
    try:
        generated = parse_arithmetic_spec(str(path))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if generated is not None:
        return generated[:limit] if limit is not None else generated
    tasks: list[dict[str, Any]] = []
    for lineno, row in iter_jsonl(path):
        if limit is not None and len(tasks) >= limit:
            break
        if isinstance(row, dict):
            row = dict(row)
            row.setdefault("id", lineno - 1)
            if "ground_truth" not in row and "answer" in row:
                row["ground_truth"] = row["answer"]
        tasks.append(row)
    return tasks
