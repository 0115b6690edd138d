"""What a run left behind under a folder, counted from the file system and /proc: processes whose working
directory is in it, and mounts below it."""

from __future__ import annotations

import os
from pathlib import Path


def processes_in(root: Path) -> list[str]:
    """`"PID: CWD"` of every process whose working directory is `root` or below it."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd == str(root) or cwd.startswith(f"{root}/"):
            found.append(f"{pid}: {cwd}")
    return found


def mounts_in(root: Path) -> list[str]:
    """The lines of this process's mount table that name `root` or a folder below it."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line for line in f if str(root) in line]
