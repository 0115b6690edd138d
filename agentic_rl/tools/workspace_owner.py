"""Who owns a run's workspaces, and removing what a dead run left: the ``owner.json`` marker of a run folder
(`owner_marker`), whether its owner is gone (`owner_dead`), and `sweep_stale_workspaces`, which removes the run
folders of dead owners. The container backend (`agentic_rl.tools.workspace_container`) labels its containers with
the same marker and sweeps them by the same rule."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from agentic_rl.tools.sandbox_processes import remove_tree, start_ticks

__all__ = ["OWNER_FILE", "owner_dead", "owner_marker", "sweep_stale_workspaces"]

logger = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
"""The marker in each run folder: ``{"pid", "start_ticks", "boot_id", "pid_namespace"}`` of the process owning it."""


def owner_marker(pid: int | None = None) -> dict[str, Any]:
    """What names the process `pid` (default: this one) across pid reuse, PID namespaces and reboots."""
    pid = os.getpid() if pid is None else pid
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        pid_namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        boot, pid_namespace = "", 0
    return {"pid": pid, "start_ticks": start_ticks(pid), "boot_id": boot, "pid_namespace": pid_namespace}


def _mount_points() -> list[str]:
    """This process's mount points (``/proc/self/mountinfo``), octal escapes decoded."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in lines]


def owner_dead(owner: dict[str, Any], here: dict[str, Any]) -> bool | None:
    """Whether the process an ``owner.json`` names is gone (None: unknown, a process of another PID namespace)."""
    if owner.get("boot_id") != here["boot_id"]:
        return True  # the machine restarted since
    if owner.get("pid_namespace") != here["pid_namespace"]:
        return None
    return start_ticks(int(owner["pid"])) != owner["start_ticks"]


def sweep_stale_workspaces(root: str | os.PathLike[str]) -> list[str]:
    """Removes the run folders under `root` that a dead process left: those whose ``owner.json`` names a process
    that no longer runs (its pid gone or reused by a later process, or the machine restarted since). A live
    owner's folders, those of an owner in another PID namespace (which cannot be told), folders without a marker
    (not ours, or being made) and folders with a mount below them are left alone.

    Returns:
        The folders removed.
    """
    root = os.fspath(root)
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    mounts, here = None, owner_marker()
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, OWNER_FILE), encoding="utf-8") as fh:
                owner = json.load(fh)
            if not owner_dead(owner, here):
                continue  # its owner still runs, or it cannot be told
        except (OSError, ValueError, KeyError, TypeError):
            continue
        mounts = _mount_points() if mounts is None else mounts
        if any(m == entry.path or m.startswith(entry.path + "/") for m in mounts):
            logger.warning("stale workspace folder %s still has a mount below it; left in place", entry.path)
            continue
        remove_tree(entry.path)
        removed.append(entry.path)
        logger.info("removed the stale workspace folder %s of dead process %s", entry.path, owner["pid"])
    return removed
