"""Reading JSON Lines task, corpus and question files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = ["iter_jsonl"]


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
