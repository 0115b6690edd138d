"""The Python sandbox's processes as the host sees them: per-session uids and scans of ``/proc``.

Per-session uids (modes ``"namespaces"`` and ``"uid"``, run as root): each session's code runs as its own unprivileged uid from ``SANDBOX_UID_BASE`` .. ``SANDBOX_UID_BASE +
SANDBOX_UID_COUNT - 1``. A uid is reserved with an exclusive ``flock`` on its lock file in a root-only directory, so
concurrent sessions (also of other processes) never share one, and a uid that still owns live processes (a
leftover of a crashed process) is skipped. Because the uid belongs to one session alone, every process of it can be
found in ``/proc`` and killed when the session ends.

The ``/proc`` scans (`process_tree`, `parent_pid`, `pid_alive`) let `SandboxTool` find the process tree of a
session's interpreter (with the PID 1 of its PID namespace) and wait until it is gone; `remove_tree` removes the
files a session leaves behind, also those it made unreadable.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from agentic_rl.errors import ToolError

__all__ = [
    "SANDBOX_UID_BASE",
    "SANDBOX_UID_COUNT",
    "describe_exit",
    "parent_pid",
    "pid_alive",
    "process_tree",
    "remove_tree",
    "reserve_uid",
    "start_ticks",
    "sweep_uid",
    "uid_processes",
]

logger = logging.getLogger("agentic_rl.tools.sandbox")  # the sandbox tool's logger, one name for all its records

SANDBOX_UID_BASE = 1_900_000_000
"""First uid (and gid) given to sandbox sessions when running as root; an unallocated range on common systems."""
SANDBOX_UID_COUNT = 4096
"""Number of uids in the sandbox range: the most concurrent sessions per machine when running as root."""


def _lock_dir() -> str:
    for base in ("/run", tempfile.gettempdir()):
        path = os.path.join(base, "agentic-rl-sandbox-uids")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.stat(path)
            if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                return path
        except OSError:
            continue
    raise ToolError("no private directory for the sandbox uid lock files (tried /run and the temp dir)")


def reserve_uid() -> tuple[int, int]:
    """Reserves a free sandbox uid with an exclusive flock, starting the search at a random uid of the range.

    Returns:
        ``(uid, lock_fd)``: the reserved uid and the file descriptor holding its lock; closing it frees the uid.

    Raises:
        ToolError: if no private lock directory can be made, or every uid of the range is in use.
    """
    directory = _lock_dir()
    start = random.randrange(SANDBOX_UID_COUNT)
    for i in range(SANDBOX_UID_COUNT):
        uid = SANDBOX_UID_BASE + (start + i) % SANDBOX_UID_COUNT
        fd = os.open(os.path.join(directory, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if uid_processes(uid):  # a leftover of a crashed process: do not reuse it
            os.close(fd)
            continue
        return uid, fd
    raise ToolError(f"all {SANDBOX_UID_COUNT} sandbox uids are in use")


def _proc_status(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _stat_after_name(pid: int) -> str | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None if `pid` is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :]


def process_tree(root: int) -> tuple[int, ...]:
    """`root` and its live (non-zombie) descendants, from ``/proc``.

    Returns:
        Host process ids, `root` first, then depth-first by parent; just ``(root,)`` when it has no children.
    """
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        after_name = _stat_after_name(int(entry))
        if after_name is None:
            continue
        fields = after_name.split()
        if fields and fields[0] not in ("Z", "X"):
            parents.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, ()))
    return tuple(tree)


def parent_pid(pid: int) -> int | None:
    """The parent's host process id of `pid`, or None if `pid` is gone."""
    after_name = _stat_after_name(pid)
    return None if after_name is None else int(after_name.split()[1])


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22), or None if it is gone: with
    the pid, it names one process even after the pid is reused."""
    after_name = _stat_after_name(pid)
    return None if after_name is None else int(after_name.split()[19])


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    after_name = _stat_after_name(pid)
    return after_name is not None and after_name[:1] not in ("Z", "X")


def uid_processes(uid: int) -> list[int]:
    """Host process ids of the live (non-zombie) processes any of whose uids (real, effective, saved) is `uid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = _proc_status(int(entry))
        except OSError:
            continue
        if status.get("State", "").startswith(("Z", "X")):
            continue
        if str(uid) in status.get("Uid", "").split():
            found.append(int(entry))
    return found


def sweep_uid(uid: int, deadline: float) -> None:
    """SIGKILLs every process of `uid` until none is left (the uid belongs to one session alone).

    Args:
        uid: the session's uid.
        deadline: `time.monotonic` time, in seconds, after which survivors are logged as an error and left.
    """
    while True:
        pids = uid_processes(uid)
        if not pids:
            return
        if time.monotonic() > deadline:
            logger.error("sandbox processes %s of uid %d survived SIGKILL", pids, uid)
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def remove_tree(path: str) -> None:
    """Removes the directory `path` and everything in it, without following symbolic links; a missing `path` is
    fine. Entries the sandboxed code made unreadable (``chmod 000``; an overlay's kernel-made work directory) are
    made accessible and retried; what still cannot be removed is logged as a warning, never raised.
    """

    def retry_writable(function: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if not os.path.islink(failed):  # a link's target may be any file of the host
                os.chmod(failed, 0o700)
        with contextlib.suppress(FileNotFoundError):
            function(failed)

    try:
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=retry_writable)
        else:
            shutil.rmtree(path, onerror=retry_writable)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            logger.warning("could not remove sandbox directory %s: %s", path, exc)


def describe_exit(returncode: int | None, exc: BaseException, pid_namespace: bool, cpu_time_limit_s: float) -> str:
    """How a sandbox interpreter ended, for an error message (``"died (SIGKILL: ...)"``).

    Args:
        returncode: its exit status (negative: killed by that signal), or None when it did not exit (yet).
        exc: what reading its answer raised.
        pid_namespace: True when a PID-1 supervisor reports the interpreter's death by signal n as status 128 + n.
        cpu_time_limit_s: the CPU time limit, in seconds, named for SIGXCPU.
    """
    if returncode is None:
        return f"stopped answering ({type(exc).__name__}: {exc})"
    number = None
    if returncode < 0:
        number = -returncode
    elif pid_namespace and 128 < returncode < 128 + 65:
        number = returncode - 128
    if number is None:
        return f"exited with status {returncode}"
    hints = {
        signal.SIGXCPU: f"CPU time limit of {cpu_time_limit_s:g} s exceeded",
        signal.SIGKILL: "killed, e.g. past the CPU time limit or by the kernel's out-of-memory killer",
        signal.SIGSEGV: "segmentation fault",
    }
    hint = hints.get(number)  # type: ignore[call-overload]
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"died ({name}{': ' + hint if hint else ''})"
