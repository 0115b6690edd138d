"""Isolation modes of the Python sandbox: what each guarantees, how its worker is started, which one works here.

`SandboxIsolation` records the guarantees of a mode and `IsolationMode` how to start a worker in it (the
``unshare`` prefix, whether to drop to a per-session uid); the modes themselves are described in
`agentic_rl.tools.sandbox`. `resolve_isolation` picks the mode for a `SandboxTool`: the requested one, or for
``"auto"`` the strongest that works (``"namespaces"``, ``"uid"``, ``"none"`` as root; ``"userns"``, ``"none"``
otherwise). Whether a mode works is learnt by starting a real probe worker in it, once per mode and process (the
answer is cached and shared by every tool), and a warning is logged once for each guarantee the chosen mode lacks.
`SessionPlacement` is where a session runs when its owner, not the sandbox, keeps its working directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import ToolError

__all__ = [
    "ISOLATION_MODES",
    "PROBE_CODE",
    "IsolationMode",
    "SandboxIsolation",
    "SessionPlacement",
    "resolve_isolation",
]

logger = logging.getLogger("agentic_rl.tools.sandbox")  # the sandbox tool's logger, one name for all its records

ISOLATION_MODES = ("auto", "namespaces", "userns", "uid", "none")
"""The accepted values of `SandboxTool`'s `isolation` argument."""
PROBE_CODE = "import fractions, json\nprint(sum(range(5)))"
"""What a probe worker runs: a mode works when its output is ``10`` (the standard library imports, code runs)."""


@dataclass(frozen=True)
class SandboxIsolation:
    """What the chosen isolation mode guarantees on this machine.

    Attributes:
        mode: ``"namespaces"``, ``"userns"``, ``"uid"`` or ``"none"`` (see `agentic_rl.tools.sandbox`).
        network: True when the code runs in an empty network namespace (no connection succeeds).
        pid_namespace: True when the session has its own PID namespace (all its processes die with it).
        private_tmp: True when ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are private to the session.
        unprivileged_uid: True when the code runs as a per-session unprivileged uid (cannot write root-owned files).
        process_limit: True when ``RLIMIT_NPROC`` bounds the processes of this session alone.
        private_root: True when the code sees only a minimal read-only root (the system's program and library
            directories, the interpreter's prefixes, a few ``/etc`` files) and its working directory; False when it
            can read every file of the host its user may read (a project checkout, its ``.git/config``).
    """

    mode: str
    network: bool
    pid_namespace: bool
    private_tmp: bool
    unprivileged_uid: bool
    process_limit: bool
    private_root: bool = False


@dataclass(frozen=True)
class IsolationMode:
    """How to start a worker in one isolation mode.

    Attributes:
        isolation: what the mode guarantees.
        unshare_args: the ``unshare`` command and its options put before the interpreter; empty for no prefix.
        drop_uid: True when each session reserves its own unprivileged uid and the worker drops to it.
    """

    isolation: SandboxIsolation
    unshare_args: tuple[str, ...]
    drop_uid: bool


@dataclass(frozen=True)
class SessionPlacement:
    """Where a sandbox session runs when its owner keeps the working directory (e.g. a code workspace).

    `SandboxTool` then neither creates nor removes the directory nor reserves a uid: the owner made them before
    `session_start` and removes them after `session_end`.

    Attributes:
        workdir: the session's working directory, an existing directory given as its real absolute host path.
        uid: the unprivileged uid the owner reserved for the session (modes with `IsolationMode.drop_uid`), or None.
        tmpdir: ``TMPDIR`` and ``HOME`` of the session; None: the working directory.
        worker_options: more keys of the worker's JSON config (see `agentic_rl.tools.sandbox_worker.setup` and
            `executor`): ``overlay``, ``own_workdir``, ``preload``, ``import_workdir``.
    """

    workdir: str
    uid: int | None
    tmpdir: str | None = None
    worker_options: Mapping[str, Any] = field(default_factory=dict)


def isolation_mode(name: str, unshare: str | None) -> IsolationMode:
    """The mode called `name` (any other name gives ``"none"``), with `unshare` as the ``unshare`` binary's path."""
    ns = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
    if name == "namespaces":
        iso = SandboxIsolation(name, True, True, True, True, True, private_root=True)
        return IsolationMode(iso, (unshare or "unshare", *ns), True)
    if name == "userns":
        args = (unshare or "unshare", "--user", "--map-root-user", *ns)
        return IsolationMode(SandboxIsolation(name, True, True, True, False, True, private_root=True), args, False)
    if name == "uid":
        return IsolationMode(SandboxIsolation(name, False, False, False, True, True), (), True)
    return IsolationMode(SandboxIsolation("none", False, False, False, False, False), (), False)


def _unshare_binary() -> str | None:
    found = shutil.which("unshare")
    if found:
        return found
    for path in ("/usr/bin/unshare", "/bin/unshare"):
        if os.access(path, os.X_OK):
            return path
    return None


_MODE_LOCK = threading.Lock()
_PROBE_LOCK = threading.Lock()  # one probe at a time, so concurrent first sessions probe once
_MODE_CACHE: dict[str, tuple[IsolationMode | None, str]] = {}  # mode name -> (mode if it works, why not)
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    with _MODE_LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    logger.warning(message)


def resolve_isolation(requested: str, run_probe: Callable[[IsolationMode], str]) -> IsolationMode:
    """The isolation mode to use: `requested`, or for ``"auto"`` the strongest that works on this machine.

    Each candidate is probed once per process (the result is cached for every caller); missing guarantees of the
    chosen mode are logged as warnings, once each.

    Args:
        requested: one of `ISOLATION_MODES`.
        run_probe: starts a throwaway worker in the given mode, runs `PROBE_CODE` in it, removes it and returns its
            output; raises `ToolError` when the worker cannot be started or fails.

    Returns:
        The first candidate mode whose probe printed ``10``.

    Raises:
        ToolError: if no candidate works (the message gives each one's reason).
    """
    root = os.geteuid() == 0
    if requested == "auto":
        names = ["namespaces", "uid", "none"] if root else ["userns", "none"]
    else:
        names = [requested]
    reasons = []
    for name in names:
        mode, reason = _probe(name, run_probe)
        if mode is not None:
            _warn_missing(mode, reasons)
            return mode
        reasons.append(f"{name}: {reason}")
    raise ToolError(f"sandbox isolation {requested!r} is not available: " + "; ".join(reasons))


def _probe(name: str, run_probe: Callable[[IsolationMode], str]) -> tuple[IsolationMode | None, str]:
    with _PROBE_LOCK:
        with _MODE_LOCK:
            if name in _MODE_CACHE:
                return _MODE_CACHE[name]
        result = _probe_uncached(name, run_probe)
        with _MODE_LOCK:
            _MODE_CACHE[name] = result
        return result


def _probe_uncached(name: str, run_probe: Callable[[IsolationMode], str]) -> tuple[IsolationMode | None, str]:
    root = os.geteuid() == 0
    unshare = _unshare_binary()
    if name in ("namespaces", "uid") and not root:
        return None, "needs root"
    if name == "userns" and root:
        return None, "for non-root users (as root, 'namespaces' is used)"
    if name in ("namespaces", "userns") and unshare is None:
        return None, "util-linux 'unshare' not found"
    mode = isolation_mode(name, unshare)
    try:
        output = run_probe(mode)
    except ToolError as exc:
        logger.debug("sandbox isolation mode %r does not work: %s", name, exc)
        return None, str(exc)
    if output.strip() != "10":
        return None, f"probe printed {output[:200]!r}"
    logger.debug("sandbox isolation mode %r works", name)
    return mode, ""


def _warn_missing(mode: IsolationMode, reasons: list[str]) -> None:
    iso = mode.isolation
    why = f" ({'; '.join(reasons)})" if reasons else ""
    if not iso.network:
        _warn_once(
            f"python sandbox (mode {iso.mode!r}): no network namespace, sandboxed code CAN reach the network{why}"
        )
    if not iso.private_tmp:
        _warn_once(f"python sandbox (mode {iso.mode!r}): /tmp is shared with the host{why}")
    if not iso.private_root:
        _warn_once(
            f"python sandbox (mode {iso.mode!r}): the host's file system is NOT hidden: sandboxed code can read "
            f"every file its user may read (e.g. the project checkout and its .git/config){why}"
        )
    if not iso.unprivileged_uid:
        who = "root" if os.geteuid() == 0 else "the calling user"
        _warn_once(f"python sandbox (mode {iso.mode!r}): code runs as {who} and can write wherever it can")
    if not iso.process_limit:
        _warn_once(f"python sandbox (mode {iso.mode!r}): no per-session process limit: fork bombs are not bounded")
