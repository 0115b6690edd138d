"""Coding workspaces: a private, isolated copy of a code base per trajectory, shared by the workspace tools.

`Workspaces` keeps one workspace per session id (trajectory). A workspace is the working directory of one session
of the Python sandbox (`WorkspaceSandbox`, a `SandboxTool` whose sessions run in a directory the workspace owns:
`SessionPlacement`), so it has the sandbox's isolation and limits: no network, its own PID namespace, private
``/tmp``, memory, CPU, process and file-size limits, a per-session uid as root (see `agentic_rl.tools.sandbox`).
Every tool call runs as Python code in that session's interpreter (`workspace_ops`, which the worker preloads), so
the tools see exactly the isolated workspace.

How the code base gets in, per workspace:

* **overlay** (where the kernel allows it: probed once per process and isolation mode by starting a real worker
  with an overlay): the worker mounts an overlay on the working directory inside its own mount namespace, the code
  base read-only below, the changes in the workspace's own ``upper`` folder. Nothing is copied; as root the tree is
  given to the session's uid with ``metacopy=on`` (metadata copied up, not data). The mount exists only in the
  sandbox's namespace: it is gone with the sandbox's processes (also if this process dies), never in the host's.
* **copy** (otherwise, or `WorkspaceConfig.copy_mode` ``"copy"``): `shutil.copytree` with links kept as links.

Lifetime: a workspace is registered with its code base (`register`, by `WorkspaceEnvironment.reset`) or made empty
on a tool's first `acquire`; it starts (directory, copy, interpreter) on first use, at most
`WorkspaceConfig.max_concurrent_starts` at once, and is removed (every process, the directory, the uid) when its
last holder releases it: each tool's `session_end`, the environment's `close`. `close` removes all. Everything lives
in one run folder under `WorkspaceConfig.root`, with an ``owner.json`` marker naming this process;
`sweep_stale_workspaces` removes run folders whose owner is dead (called when a `Workspaces` is made).

The tests of a task (`TestSpec`: ``test_command``, hidden ``test_files``, ``fail_to_pass`` / ``pass_to_pass``, ``test_timeout_s``)
run with `run_tests` in the trajectory's workspace after the episode, in a fresh interpreter (the model's, and every
process it started, killed first); `run_workspace_tests` finds a live workspace from the task's
``workspace_session``, which the environment adds.

Backends (`WorkspaceConfig.backend`): ``"sandbox"`` (the default, above), or ``"podman"`` / ``"docker"``: the
workspace is a copy whose folder is bind-mounted into a container of its own, started from the task's ``image`` (else
`WorkspaceConfig.image`), where every tool call and the test run execute (`agentic_rl.tools.workspace_container`);
the container is removed with the workspace, and `sweep_stale_containers` removes those of dead runs.

Bounded: the code base's size (`WorkspaceConfig.max_codebase_mb`), each file written (``max_file_mb``), ``/tmp``;
not bounded: the total a trajectory writes into its workspace (its ``upper`` folder or copy, on the host's disk).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import ConfigError, ToolError, ToolUnavailableError
from agentic_rl.tools import workspace_ops
from agentic_rl.tools.sandbox import SandboxIsolation, SandboxTool, SessionPlacement
from agentic_rl.tools.sandbox_isolation import IsolationMode
from agentic_rl.tools.sandbox_processes import remove_tree, reserve_uid
from agentic_rl.tools.workspace_codebase import CodebaseCache, copy_codebase
from agentic_rl.tools.workspace_config import TestRun, TestSpec, WorkspaceConfig
from agentic_rl.tools.workspace_container import CONTAINER_ROOT, STATE_FILE, ContainerBackend, sweep_stale_containers
from agentic_rl.tools.workspace_owner import OWNER_FILE, owner_marker, sweep_stale_workspaces

__all__ = [
    "ENVIRONMENT_HOLDER",
    "OWNER_FILE",
    "WorkspaceInfo",
    "WorkspaceSandbox",
    "Workspaces",
    "live_workspace",
    "owner_marker",
    "run_workspace_tests",
    "sweep_stale_workspaces",
]

logger = logging.getLogger(__name__)

ENVIRONMENT_HOLDER = "environment"
"""The holder name `register` gives the environment (tools hold a workspace under their own names)."""
_PRELOAD = "agentic_rl_workspace_ops"
_OPS_PATH = os.path.abspath(workspace_ops.__file__)
_GRACE_S = 15.0  # beyond the test command's own time limit: killing it, reading the report, the reply
_LIVE: dict[str, tuple[weakref.ref[Workspaces], str]] = {}  # workspace_session key -> (manager, session id)
_LIVE_LOCK = threading.Lock()
_OVERLAY: dict[tuple[str, str], tuple[bool, str]] = {}  # (isolation mode, root) -> (overlay works, why not)
_OVERLAY_LOCK = threading.Lock()


@dataclass(frozen=True)
class WorkspaceInfo:
    """A live workspace, for diagnostics and tests.

    Attributes:
        session_id: its session (trajectory).
        path: the workspace root as the sandbox's code sees it (in overlay mode an empty mount point on the host;
            with a container backend `CONTAINER_ROOT`, in the container).
        folder: the host folder holding the workspace's files: the copy, or the overlay's ``upper`` (changes only).
        codebase: the folder the code base came from (an archive's unpacked folder), or None for an empty one.
        overlay: True when the workspace is an overlay on the code base, False for a copy; None before it started.
        uid: the session's uid, or None when the code runs as the calling user.
        pids: host process ids of its sandbox when its interpreter last started (empty when it is not running, and
            with a container backend).
        container: the name of its container (container backends), or None.
    """

    session_id: str
    path: str | None
    folder: str | None
    codebase: str | None
    overlay: bool | None
    uid: int | None
    pids: tuple[int, ...]
    container: str | None = None


class WorkspaceSandbox(SandboxTool):
    """The sandbox under `Workspaces`: a session listed in `placements` runs in its workspace (`SessionPlacement`);
    others (the isolation probe) as in `SandboxTool`."""

    def __init__(self, **limits: Any) -> None:
        super().__init__(**limits)
        self.placements: dict[str, SessionPlacement] = {}

    def _placement(self, session_id: str, mode: IsolationMode) -> SessionPlacement | None:
        return self.placements.get(session_id)


@dataclass(eq=False)
class _Workspace:
    session_id: str
    key: str | None
    codebase: str | None
    holders: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)  # start vs. removal
    directory: str | None = None
    workdir: str | None = None
    folder: str | None = None
    overlay: bool | None = None
    uid: int | None = None
    uid_lock_fd: int | None = None
    started: bool = False
    closed: bool = False
    image: str | None = None  # container backends: the image it runs in
    container: str | None = None  # container backends: the running container
    calls: threading.Lock = field(default_factory=threading.Lock)  # container backends: one exec call at a time


def _close_run(sandbox: SandboxTool, run_root: str, containers: ContainerBackend | None) -> None:
    """At exit, for a `Workspaces` never closed: end its sandboxes and containers, remove its run folder."""
    sandbox.close()
    if containers is not None:
        containers.remove_all()
    remove_tree(run_root)


class Workspaces:
    """One private workspace per session id, shared by the workspace tools of a trajectory (see the module
    docstring). Thread-safe: tools call it from worker threads.

    Args:
        config: a `WorkspaceConfig`, or a mapping of its fields (None: the defaults).

    Raises:
        ConfigError: for a bad config value (`WorkspaceConfig`).
        OSError: if the run folder cannot be made.
    """

    def __init__(self, config: WorkspaceConfig | Mapping[str, Any] | None = None) -> None:
        if not isinstance(config, WorkspaceConfig):
            config = WorkspaceConfig.model_validate(dict(config or {}))
        self.config = config
        cap = config.max_output_bytes
        self.sandbox = WorkspaceSandbox(
            timeout_s=config.op_timeout_s,
            max_output_bytes=6 * (cap + 4096) + (1 << 16),  # JSON-escaped output (ASCII), with room for the reply
            memory_limit_mb=config.memory_limit_mb,
            cpu_time_limit_s=config.cpu_time_limit_s,
            max_processes=config.max_processes,
            max_file_mb=config.max_file_mb,
            startup_timeout_s=config.startup_timeout_s,
            isolation=config.isolation,
        )
        base = config.root or os.path.join(tempfile.gettempdir(), f"agentic-rl-workspaces-{os.geteuid()}")
        os.makedirs(base, mode=0o711, exist_ok=True)
        self.root = os.path.realpath(base)
        if config.backend != "sandbox":
            sweep_stale_containers(config.backend)  # before their folders go
        sweep_stale_workspaces(self.root)
        self.run_root = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=self.root)
        os.chmod(self.run_root, 0o711)  # a per-session uid (mode "uid") must reach its workspace below it
        with open(os.path.join(self.run_root, OWNER_FILE), "w", encoding="utf-8") as fh:
            json.dump(owner_marker(), fh)
        self._codebases = CodebaseCache(os.path.join(self.run_root, "codebases"), int(config.max_codebase_mb * 2**20))
        self._starts = threading.BoundedSemaphore(config.max_concurrent_starts)
        self._workspaces: dict[str, _Workspace] = {}
        self._lock = threading.Lock()
        self._token = uuid.uuid4().hex[:12]
        self.containers = None if config.backend == "sandbox" else ContainerBackend(config, self._token, self.run_root)
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_run, self.sandbox, self.run_root, self.containers)

    # ------------------------------------------------------------------------------------------ public API

    @property
    def isolation(self) -> SandboxIsolation:
        """What the sandbox's isolation mode guarantees here (probed on first use)."""
        return self.sandbox.isolation

    @property
    def overlay(self) -> bool:
        """Whether workspaces are overlays on their code base here (False: copies, always with a container
        backend); probed once per process."""
        return self.containers is None and self._overlay_works(self.sandbox.isolation)

    def register(self, session_id: str, codebase: str | os.PathLike[str] | None, image: Any = None) -> str:
        """Names the code base of session `session_id`'s workspace, before any tool uses it, and holds the workspace
        for the environment (`ENVIRONMENT_HOLDER`) until it releases it. An archive is unpacked now (once per run).

        Args:
            image: the task's container image (a task's ``image``), overriding `WorkspaceConfig.image`; only with a
                container backend.

        Returns:
            The workspace's key, unique in this process: the task's ``workspace_session`` (`live_workspace`).

        Raises:
            ConfigError: for a code base that cannot be used (see `CodebaseCache.folder`), a session id that
                already has a workspace, an image under the sandbox backend, or a container backend without an image
                (neither the task's nor the config's), whose binary does not answer or lacks the image locally.
            ToolError: after `close`.
        """
        image = self._image(image)
        if self.containers is not None and image is not None:
            self.containers.check_image(image)
        folder = None if codebase is None else self._codebases.folder(codebase)
        key = f"{self._token}/{session_id}"
        with self._lock:
            if self._closed:
                raise ToolError("the workspaces were closed")
            if session_id in self._workspaces:
                raise ConfigError(
                    f"session {session_id!r} already has a workspace: give each trajectory its own id (a task's "
                    "'trajectory_id'; n samples of one task at once need one each)"
                )
            self._workspaces[session_id] = _Workspace(session_id, key, folder, {ENVIRONMENT_HOLDER}, image=image)
        with _LIVE_LOCK:
            _LIVE[key] = (weakref.ref(self), session_id)
        return key

    def acquire(self, session_id: str, holder: str) -> None:
        """Holds session `session_id`'s workspace for `holder` (a tool's name) and starts it if it is not running:
        an unregistered session gets an empty workspace. A start that fails leaves no hold.

        Raises:
            ToolUnavailableError: if the sandbox or the workspace cannot start.
            ToolError: after `close`, or where the required isolation mode does not work.
        """
        with self._lock:
            if self._closed:
                raise ToolError("the workspaces were closed")
            ws = self._workspaces.setdefault(session_id, _Workspace(session_id, None, None))
            ws.holders.add(holder)
        try:
            self._start(ws)
        except BaseException:
            self.release(session_id, holder)
            raise

    def release(self, session_id: str, holder: str) -> None:
        """Drops `holder`'s hold; the last one removes the workspace: its processes, directory and uid. Idempotent."""
        with self._lock:
            ws = self._workspaces.get(session_id)
            if ws is None:
                return
            ws.holders.discard(holder)
            if ws.holders:
                return
            del self._workspaces[session_id]
        self._destroy(ws)

    def call(self, session_id: str, op: str, args: dict[str, Any], *, timeout_s: float) -> Any:
        """Runs the `workspace_ops` call `op` with its checked `args` in the session's interpreter (started first if
        needed) and returns its result.

        Args:
            timeout_s: wall-clock bound of the call, in seconds, past which the interpreter is killed.

        Raises:
            ToolError: the call's own failure, with a message for the model (a missing file, an ambiguous edit), or
                the interpreter's (timed out, died: its state is lost).
            ToolUnavailableError: if the interpreter cannot start or sent a reply that is not one.
        """
        ws = self._get(session_id)
        self._start(ws)
        if self.containers is not None and ws.container is not None:
            request = json.dumps({"op": op, "root": CONTAINER_ROOT, "args": args, "state": STATE_FILE})
            with ws.calls:  # one call at a time, as in a sandbox session
                text = self.containers.call(ws.container, request, timeout_s=timeout_s)
        else:
            request = json.dumps({"op": op, "root": ws.workdir, "args": args})
            code = f"import {_PRELOAD} as _ops\n_ops.main({request!r})"
            text = self.sandbox.run_code(session_id, code, timeout_s=timeout_s)
        at = text.rfind(workspace_ops.REPLY_MARKER)
        try:
            reply = json.loads(text[at + len(workspace_ops.REPLY_MARKER) :]) if at >= 0 else None
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or not ("ok" in reply or "error" in reply):
            if ws.closed:
                raise ToolError("the workspace was removed")
            raise ToolUnavailableError(f"the workspace sandbox did not answer {op!r} as expected: {text[-2000:]}")
        if "error" in reply:
            raise ToolError(str(reply["error"]))
        return reply["ok"]

    def run_tests(self, session_id: str, spec: TestSpec) -> TestRun:
        """Runs `spec` in session `session_id`'s workspace in a fresh interpreter: the model's interpreter and every
        process of the session (of its container, with a container backend) are killed first, then the hidden test
        files are written and the command runs.

        Raises:
            ToolError: if the session has no workspace, a test file's path leaves the workspace, or the interpreter
                timed out or died (`ToolUnavailableError` if it could not start).
        """
        ws = self._get(session_id)
        self._start(ws)
        if self.containers is not None and ws.container is not None:
            with ws.calls:  # after the model's running call, if any
                self.containers.kill_all(ws.container)
        else:
            self.sandbox.restart(session_id)
        started = time.perf_counter()
        args = {"command": spec.command, "files": spec.files, "listed": list(spec.listed), "timeout_s": spec.timeout_s}
        result = self.call(session_id, "run_tests", args, timeout_s=spec.timeout_s + _GRACE_S)  # its start: apart
        return TestRun(
            returncode=result["returncode"],
            report=bool(result["report"]),
            total=int(result["total"]),
            passed=int(result["passed"]),
            listed=len(spec.listed),
            listed_passed=int(result["listed_passed"]),
            not_passed=dict(result["not_passed"]),
            memory_errors=int(result["memory_errors"]),
            tail=str(result["tail"]),
            seconds=time.perf_counter() - started,
            overlay=bool(ws.overlay),
        )

    def info(self, session_id: str) -> WorkspaceInfo | None:
        """The live workspace of `session_id`, or None."""
        with self._lock:
            ws = self._workspaces.get(session_id)
        if ws is None:
            return None
        sandbox = self.sandbox.session_info(session_id)
        pids = sandbox.pids if sandbox is not None else ()
        path = CONTAINER_ROOT if ws.container is not None else ws.workdir
        return WorkspaceInfo(session_id, path, ws.folder, ws.codebase, ws.overlay, ws.uid, pids, ws.container)

    def close(self) -> None:
        """Removes every workspace (processes, directories, uids) and the run folder. Idempotent; never raises."""
        with self._lock:
            self._closed = True
            live, self._workspaces = list(self._workspaces.values()), {}
        for ws in live:
            self._destroy(ws)
        self._finalizer()  # ends the sandbox's other sessions and removes the run folder, once

    # ------------------------------------------------------------------------------------------ internals

    def _get(self, session_id: str) -> _Workspace:
        with self._lock:
            ws = self._workspaces.get(session_id)
        if ws is None:
            raise ToolError(f"session {session_id!r} has no workspace (it ended, or was never started)")
        return ws

    def _start(self, ws: _Workspace) -> None:
        with ws.lock:
            if ws.started:
                return
            if ws.closed:
                raise ToolError("the workspace was removed")
            with self._starts:
                try:
                    if self.containers is not None:
                        self._start_container(ws)
                    else:
                        self._make(ws, self._overlay_works(self.sandbox.isolation))
                        self.sandbox.session_start(ws.session_id)
                except BaseException:
                    self._remove(ws)
                    raise
            ws.started = True

    def _make(self, ws: _Workspace, overlay: bool) -> None:
        """The workspace's directory, its files (a copy) or overlay folders, uid and placement."""
        isolation = self.sandbox.isolation
        if isolation.unprivileged_uid:
            ws.uid, ws.uid_lock_fd = reserve_uid()
        try:
            self._folders(ws, copy=not overlay)
            options: dict[str, Any] = {"preload": {"name": _PRELOAD, "path": _OPS_PATH}, "import_workdir": False}
            options["own_workdir"] = True
            if overlay:
                upper, scratch = os.path.join(ws.directory, "upper"), os.path.join(ws.directory, "scratch")
                os.mkdir(upper, 0o755)  # the workspace root's mode
                os.mkdir(scratch, 0o700)
                lower = ws.codebase or self._empty_folder()
                options["overlay"] = {"lower": lower, "upper": upper, "work": scratch}
                ws.folder = upper
            tmpdir = "/tmp"  # the session's private tmpfs; without one, a folder beside (not in) the workspace
            if not isolation.private_tmp:
                tmpdir = os.path.join(ws.directory, "tmp")
                os.mkdir(tmpdir, 0o700)
                if ws.uid is not None:
                    os.chown(tmpdir, ws.uid, ws.uid)
        except OSError as exc:
            raise ToolUnavailableError(f"could not prepare the workspace: {exc}") from exc
        ws.overlay = overlay
        self.sandbox.placements[ws.session_id] = SessionPlacement(ws.workdir, ws.uid, tmpdir, options)

    def _folders(self, ws: _Workspace, copy: bool) -> None:
        """The workspace's directory and its ``work`` folder, holding a copy of the code base when `copy`.
        Raises `OSError`."""
        ws.directory = tempfile.mkdtemp(prefix="ws-", dir=self.run_root)
        os.chmod(ws.directory, 0o711)
        ws.workdir = os.path.join(ws.directory, "work")
        os.mkdir(ws.workdir, 0o755)
        if copy:
            if ws.codebase is not None:
                copy_codebase(ws.codebase, ws.workdir)
            ws.folder = ws.workdir

    def _start_container(self, ws: _Workspace) -> None:
        """The workspace's copy, in a container of its own (container backends). Raises `ToolUnavailableError`."""
        assert self.containers is not None
        image = ws.image or self.config.image
        if image is None:
            raise ToolUnavailableError("no container image: set WorkspaceConfig.image")
        try:
            self._folders(ws, copy=True)
        except OSError as exc:
            raise ToolUnavailableError(f"could not prepare the workspace: {exc}") from exc
        ws.overlay = False
        name = f"agentic-rl-{self._token}-{uuid.uuid4().hex[:8]}"
        ws.container = self.containers.start(name, image, ws.workdir)

    def _image(self, image: Any) -> str | None:
        """The image of a workspace whose task names `image` (None: the config's). Raises `ConfigError` for an
        image under the sandbox backend, one that is not a non-empty string, or none at all with a container one."""
        if image is not None and self.containers is None:
            raise ConfigError(
                f"the task names the container image {image!r}, but the workspaces use the sandbox backend: set "
                "WorkspaceConfig.backend to 'podman' or 'docker', or drop the task's 'image'"
            )
        if image is not None and (not isinstance(image, str) or not image.strip()):
            raise ConfigError(f"task field 'image' must name a container image, got {image!r}")
        image = image or self.config.image
        if image is None and self.containers is not None:
            raise ConfigError(
                f"backend {self.config.backend!r} needs an image: the task's 'image' or WorkspaceConfig.image"
            )
        return image

    def _empty_folder(self) -> str:
        path = os.path.join(self.run_root, "empty")
        os.makedirs(path, mode=0o755, exist_ok=True)
        return path

    def _destroy(self, ws: _Workspace) -> None:
        ws.closed = True
        if ws.key is not None:
            with _LIVE_LOCK:
                _LIVE.pop(ws.key, None)
        self.sandbox.session_end(ws.session_id)  # unblocks a running call of the session at once
        with ws.lock:
            self._remove(ws)

    def _remove(self, ws: _Workspace) -> None:
        """Ends the session (or removes the container) and removes what `_make` made. Caller holds `ws.lock`."""
        self.sandbox.session_end(ws.session_id)
        if self.containers is not None and ws.container is not None:
            self.containers.remove(ws.container)
            ws.container = None
        self.sandbox.placements.pop(ws.session_id, None)
        if ws.directory is not None:
            remove_tree(ws.directory)
        if ws.uid_lock_fd is not None:
            os.close(ws.uid_lock_fd)
        ws.directory = ws.uid_lock_fd = None
        ws.started = False

    def _overlay_works(self, isolation: SandboxIsolation) -> bool:
        """Whether this machine mounts the workspace overlay (probed once per process, isolation mode and root).

        Raises:
            ToolError: when `copy_mode` is ``"overlay"`` and it does not.
        """
        mode = self.config.copy_mode
        if mode == "copy":
            return False
        key = (isolation.mode, self.root)
        with _OVERLAY_LOCK:
            if key not in _OVERLAY:
                if isolation.mode not in ("namespaces", "userns"):
                    _OVERLAY[key] = (False, f"isolation mode {isolation.mode!r} has no mount namespace")
                else:
                    _OVERLAY[key] = self._probe_overlay()
                logger.info("coding workspaces: %s", "overlay" if _OVERLAY[key][0] else f"copy ({_OVERLAY[key][1]})")
            works, why = _OVERLAY[key]
        if not works and mode == "overlay":
            raise ToolError(f"copy_mode 'overlay' does not work here: {why}")
        return works

    def _probe_overlay(self) -> tuple[bool, str]:
        """Starts a real worker with an overlay on a throwaway code base and writes through it."""
        probe = _Workspace(f"overlay-probe-{uuid.uuid4().hex[:8]}", None, None)
        lower = tempfile.mkdtemp(prefix="probe-lower-", dir=self.run_root)
        os.chmod(lower, 0o755)
        try:
            with open(os.path.join(lower, "probe.txt"), "w", encoding="utf-8") as fh:
                fh.write("lower\n")
            os.chmod(os.path.join(lower, "probe.txt"), 0o644)
            probe.codebase = lower
            self._make(probe, overlay=True)
            self.sandbox.session_start(probe.session_id)
            code = "open('probe.txt', 'a').write('upper\\n'); print(open('probe.txt').read(), end='')"
            output = self.sandbox.run_code(probe.session_id, code, timeout_s=self.config.startup_timeout_s)
            with open(os.path.join(lower, "probe.txt"), encoding="utf-8") as fh:
                untouched = fh.read() == "lower\n"
            if output == "lower\nupper\n" and untouched:
                return True, ""
            return False, f"the probe printed {output[:300]!r}"
        except ToolError as exc:
            return False, str(exc)
        finally:
            self._remove(probe)
            remove_tree(lower)


def live_workspace(key: str) -> tuple[Workspaces, str]:
    """The manager and session id of the live workspace whose key is `key` (a task's ``workspace_session``).

    Raises:
        ToolError: if no live workspace has that key (it was removed, or the task did not come from a
            `WorkspaceEnvironment`).
    """
    with _LIVE_LOCK:
        ref, session_id = _LIVE.get(key, (None, ""))
    manager = ref() if ref is not None else None
    if manager is None:
        raise ToolError(
            f"no live workspace {key!r}: it was closed already, or the task did not come from a WorkspaceEnvironment's "
            "reset"
        )
    return manager, session_id


def run_workspace_tests(task: Mapping[str, Any]) -> TestRun:
    """Runs the tests `task` names (`TestSpec.from_task`) in its trajectory's live workspace (`Workspaces.run_tests`).

    Raises:
        ConfigError: for malformed test fields, or a task that names no tests.
        ToolError: if the task has no live workspace, or the run could not complete (`Workspaces.run_tests`).
    """
    key = task.get("workspace_session")
    if not isinstance(key, str):
        raise ToolError("the task has no 'workspace_session': it must come from a WorkspaceEnvironment's reset")
    manager, session_id = live_workspace(key)
    spec = TestSpec.from_task(task, default_timeout_s=manager.config.test_timeout_s)
    if spec is None:
        raise ConfigError("the task names no tests: give test_command, or fail_to_pass / pass_to_pass")
    return manager.run_tests(session_id, spec)
