"""A stateful Python tool: one persistent, sandboxed interpreter per session (trajectory).

Each session runs the worker program `agentic_rl.tools.sandbox_worker` in its own process, by path from the package
(`sys.executable -I <its file> <JSON config>`; that module says why no copy is needed). The parent sends the code
of each call as a length-prefixed JSON frame on the worker's stdin; the worker executes it in a persistent
globals dict and answers with the captured stdout + stderr (a traceback for an exception, the repr of a final
expression), capped inside the worker. Variables, imports and files in the private working directory persist
between the calls of a session; `session_end` kills every process of the session and removes the directory.

This module holds `SandboxTool` (sessions: start, call, kill, clean up). Its pieces live beside it:
`agentic_rl.tools.sandbox_isolation` (the isolation modes and the probe that picks one),
`agentic_rl.tools.sandbox_processes` (per-session uid reservation and ``/proc`` scans),
`agentic_rl.tools.sandbox_framing` (the parent's side of the frame protocol) and the worker program itself. A
subclass may run a session in a directory it owns (the `_placement` hook and `SessionPlacement`: a code workspace,
`agentic_rl.tools.workspace`); `run_code` and `restart` serve such owners.

Isolation: the strongest mode that works on the machine is chosen once per process (`isolation="auto"`) by
starting a real probe worker, and a warning is logged once for whatever is missing:

* ``"namespaces"`` (root with util-linux ``unshare``): new mount, network, PID, IPC and UTS namespaces. The network
  namespace holds only a loopback interface that is down, so no connection (not even to 127.0.0.1) succeeds.
  The root is replaced (``pivot_root``, the host's root unmounted) by a minimal read-only one: the system's
  program and library directories (``/usr``, ``/bin``, ``/lib``, ...), the interpreter's prefixes (its virtual
  environment and base installation, not other `sys.path` entries such as an editable checkout), the dynamic
  linker's cache and a few other ``/etc`` files, ``/dev/null`` and the random devices, a fresh ``/proc``, private
  tmpfs ``/tmp``, ``/var/tmp`` and ``/dev/shm``, and the session's working directory (read-write, at its host
  path). Nothing else of the host (home directories, the project checkout, its ``.git``) can be read or listed.
  The worker then drops to a per-session unprivileged uid/gid (no supplementary groups, ``no_new_privs``), and
  ``RLIMIT_NPROC`` bounds the processes of that session alone. A supervisor is PID 1 of the namespace: it reaps
  orphans, and when it dies the kernel kills everything left in the namespace.
* ``"userns"`` (non-root with unprivileged user namespaces): the same namespaces inside a new user namespace;
  the code runs as the calling user (mapped to root inside, with every capability dropped), and the root is the
  same minimal read-only one, so it writes only to its working directory and private tmpfs; ``RLIMIT_NPROC`` is
  counted per user namespace, so per session.
* ``"uid"`` (root without usable namespaces): per-session unprivileged uid and rlimits only. Network access is
  NOT blocked, ``/tmp`` is shared (files there are owned by the session uid) and the host's file system is NOT
  hidden: every world-readable file (a project checkout, its ``.git/config``) can be read. Leftover processes
  are found and killed by their uid.
* ``"none"``: rlimits (without ``RLIMIT_NPROC``) in a new process group only, as the calling user, who sees the
  whole host file system; every missing guarantee is logged as a warning. Fork bombs are not bounded and
  processes that leave the group survive.

``"auto"`` falls back to ``"uid"`` or ``"none"`` where namespaces do not work and logs a warning for each missing
guarantee (the host's file system visible included); to fail closed instead, require ``"namespaces"`` (root) or
``"userns"`` (non-root): `session_start` then raises `ToolError` on such a machine.

Limits always applied inside the worker: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU`` (CPU seconds per process
lifetime), ``RLIMIT_NPROC`` (processes and threads; not in mode ``"none"``, where it would count all of the user's
processes), ``RLIMIT_FSIZE`` (largest file written), ``RLIMIT_CORE`` = 0. The environment is scrubbed to PATH,
HOME, LANG, PYTHONHASHSEED, TMPDIR and single-thread BLAS/OpenMP settings. Per-session uids come from
``SANDBOX_UID_BASE`` .. ``SANDBOX_UID_BASE + SANDBOX_UID_COUNT - 1`` and are reserved with ``flock`` on a root-only
lock file, so concurrent sessions (also of other processes) never share one.

Cleanup: every interpreter runs in a new session/process group. A timeout, `session_end` or a dead interpreter
kills the namespace's PID 1 (the kernel then kills the whole namespace and ``unshare`` reaps it), then the process
group, then, with a per-session uid, every process of that uid; the parent reaps what it started. If the parent
process dies without `session_end`, a watchdog thread in the worker sees its stdin close and kills the session's
processes (not the working directory, which stays in the temp dir).

Known limits: output printed before a timeout is lost with the process; the working directory's total size is
not bounded (only each file, by ``max_file_mb``); children that the user's code forks and never waits for stay
zombies of the interpreter and count against ``max_processes`` until the interpreter restarts, as in plain Python;
in modes ``"uid"`` and ``"none"`` orphaned children are reaped by the host's init, not by the sandbox; mode
``"uid"`` needs the interpreter to be readable by an unprivileged uid (a Python under ``/root`` is not).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import ConfigError, ToolError, ToolUnavailableError
from agentic_rl.tools import sandbox_worker
from agentic_rl.tools.base import StatefulTool
from agentic_rl.tools.sandbox_framing import ProtocolError, read_frame, write_frame
from agentic_rl.tools.sandbox_isolation import (
    ISOLATION_MODES,
    PROBE_CODE,
    IsolationMode,
    SandboxIsolation,
    SessionPlacement,
    resolve_isolation,
)
from agentic_rl.tools.sandbox_processes import (
    SANDBOX_UID_BASE,
    SANDBOX_UID_COUNT,
    describe_exit,
    parent_pid,
    pid_alive,
    process_tree,
    remove_tree,
    reserve_uid,
    sweep_uid,
)

__all__ = [
    "SANDBOX_UID_BASE",
    "SANDBOX_UID_COUNT",
    "SandboxIsolation",
    "SandboxSessionInfo",
    "SandboxTool",
    "SessionPlacement",
]

logger = logging.getLogger(__name__)

_WORKER_PATH = os.path.abspath(sandbox_worker.__file__)
_KILL_GRACE_S = 5.0  # time to kill, reap and sweep a session's processes


# ------------------------------------------------------------------------------------------------- public records


@dataclass(frozen=True)
class SandboxSessionInfo:
    """Diagnostics of one live session.

    Attributes:
        workdir: the private working directory (host path), removed by `session_end`.
        uid: the session's uid, or None when the code runs as the calling user.
        pids: host process ids of the session's process tree when its interpreter was started (empty when the
            interpreter is not running, e.g. after a timeout until the next call).
    """

    workdir: str
    uid: int | None
    pids: tuple[int, ...]


# ------------------------------------------------------------------------------------------------- the tool


@dataclass
class _Session:
    session_id: str
    workdir: str
    uid: int | None
    uid_lock_fd: int | None
    mode: IsolationMode
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call at a time
    proc_lock: threading.Lock = field(default_factory=threading.Lock)  # guards proc: spawn vs. kill
    proc: subprocess.Popen[bytes] | None = None
    pids: tuple[int, ...] = ()
    closed: bool = False
    placement: SessionPlacement | None = None  # the owner keeps the directory and the uid


class SandboxTool(StatefulTool):
    """Runs Python code in a persistent, sandboxed interpreter: one process per session (trajectory).

    Variables, imports and files in the session's private working directory persist between calls of the same
    session. The observation is the captured stdout + stderr of the call (plus the repr of a final expression
    statement), or the traceback of an exception it raised; it is cut to `max_output_bytes` with a
    ``[output truncated: ...]`` marker. See the module docstring for the isolation modes.

    The environment's limit for one call (`call_timeout_s`) is `timeout_s` plus `startup_timeout_s` plus a few
    seconds to kill the process, so the sandbox's own timeout message normally reaches the model first.

    Args:
        timeout_s: wall-clock limit of one call's code, in seconds. Past it the session's processes are killed,
            the next call starts a fresh interpreter, and the call raises `ToolError` saying the state was lost.
        max_output_bytes: most bytes of output returned per call, in UTF-8; the output is cut between characters
            (never inside one) and the marker gives the exact number of UTF-8 bytes left out.
        memory_limit_mb: address-space limit of each sandbox process, in MiB (``RLIMIT_AS``); a larger
            allocation raises `MemoryError` inside the sandbox.
        cpu_time_limit_s: CPU seconds each sandbox process may use over its whole life (``RLIMIT_CPU``); the
            interpreter is killed past it (the call raises `ToolError`, the next call starts a fresh one).
        max_processes: most processes and threads of a session (``RLIMIT_NPROC``), the fork-bomb bound.
        max_file_mb: largest file a sandbox process may write, in MiB (``RLIMIT_FSIZE``), and the size of each
            private tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``) in the namespace modes.
        max_code_bytes: longest accepted `code` argument, in UTF-8 bytes.
        startup_timeout_s: wall-clock limit for starting one interpreter, in seconds. An interpreter starts in well
            under a second on an idle machine; the default (60) is a hang guard that also holds on a machine loaded
            many times over (a start there took over 15 s).
        isolation: ``"auto"`` (the strongest mode that works here) or one of ``"namespaces"``, ``"userns"``,
            ``"uid"``, ``"none"`` to require that mode (`session_start` raises `ToolError` when it does not work).

    Raises:
        ConfigError: if a limit is not positive or `isolation` is unknown.
    """

    name = "python"
    description = (
        "Run Python 3 code in a persistent sandboxed interpreter. Variables, imports and files in the working "
        "directory persist between calls of this conversation. Returns what the code prints (stdout and stderr) "
        "and the value of a final expression; an exception returns its traceback. Use print() to see results. "
        "Time, memory and processes are limited, and network access is usually unavailable."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source code to execute."}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        max_output_bytes: int = 8192,
        memory_limit_mb: int = 512,
        cpu_time_limit_s: float = 60.0,
        max_processes: int = 64,
        max_file_mb: int = 64,
        max_code_bytes: int = 100_000,
        startup_timeout_s: float = 60.0,
        isolation: str = "auto",
    ) -> None:
        for label, value in [
            ("timeout_s", timeout_s),
            ("max_output_bytes", max_output_bytes),
            ("memory_limit_mb", memory_limit_mb),
            ("cpu_time_limit_s", cpu_time_limit_s),
            ("max_processes", max_processes),
            ("max_file_mb", max_file_mb),
            ("max_code_bytes", max_code_bytes),
            ("startup_timeout_s", startup_timeout_s),
        ]:
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{label} must be a positive number, got {value!r}")
        if isolation not in ISOLATION_MODES:
            raise ConfigError(f"isolation must be one of {', '.join(ISOLATION_MODES)}; got {isolation!r}")
        if sys.platform != "linux":
            raise ConfigError("SandboxTool needs Linux")
        self.timeout_s = float(timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self.memory_limit_mb = int(memory_limit_mb)
        self.cpu_time_limit_s = float(cpu_time_limit_s)
        self.max_processes = int(max_processes)
        self.max_file_mb = int(max_file_mb)
        self.max_code_bytes = int(max_code_bytes)
        self.startup_timeout_s = float(startup_timeout_s)
        self.requested_isolation = isolation
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._mode: IsolationMode | None = None

    # ------------------------------------------------------------------------------------------ public API

    @property
    def call_timeout_s(self) -> float:
        """The environment's bound on one call: `timeout_s` + `startup_timeout_s` + a grace to kill the process."""
        return self.timeout_s + self.startup_timeout_s + _KILL_GRACE_S

    @property
    def isolation(self) -> SandboxIsolation:
        """The isolation this tool's sessions get (probed on first use).

        Raises:
            ToolError: if the requested isolation mode does not work on this machine.
        """
        return self._resolve_mode().isolation

    def session_start(self, session_id: str) -> None:
        """Creates the session's working directory and starts its interpreter. A no-op for a live session.

        Raises:
            ToolUnavailableError: if the interpreter or its working directory cannot be started (an infrastructure
                failure: the trajectory is retried).
            ToolError: if the requested isolation does not work.
        """
        mode = self._resolve_mode()
        with self._lock:
            if session_id in self._sessions:
                return
        session = self._new_session(session_id, mode)
        with self._lock:
            if session_id in self._sessions:  # started concurrently by another thread
                duplicate = True
            else:
                self._sessions[session_id] = session
                duplicate = False
        if duplicate:
            self._destroy(session)
            return
        try:
            with session.lock:
                self._spawn(session)
        except BaseException:
            self.session_end(session_id)
            raise

    def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        """Runs `arguments["code"]` in the session's interpreter and returns its output.

        Returns:
            stdout + stderr of the call (exceptions as traceback text), cut to `max_output_bytes` with a marker;
            ``"(no output)"`` when there is none.

        Raises:
            ToolError: for a missing or non-string `code`, code over `max_code_bytes`, an unknown or closed
                session, a call past `timeout_s` (the state is lost), or an interpreter that died or failed to start.
        """
        code = arguments.get("code") if isinstance(arguments, dict) else None
        if not isinstance(code, str):
            raise ToolError("the 'code' argument must be a string of Python source code")
        if len(code.encode("utf-8", "surrogatepass")) > self.max_code_bytes:
            raise ToolError(f"code is longer than {self.max_code_bytes} bytes")
        return self.run_code(session_id, code)

    def run_code(self, session_id: str, code: str, *, timeout_s: float | None = None) -> str:
        """Runs `code` in the session's interpreter (started first if it is not running): `execute_session` without
        its checks of the argument, for code of the caller's own (no `max_code_bytes` bound).

        Args:
            session_id: a started session.
            code: Python source.
            timeout_s: wall-clock limit of this call in seconds (None: `timeout_s`).

        Returns:
            What `execute_session` returns.

        Raises:
            ToolError: as `execute_session`; `ToolUnavailableError` when the interpreter cannot start.
        """
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise ToolError(f"unknown session {session_id!r}: call session_start first")
        with session.lock:
            if session.closed:
                raise ToolError("the session was closed")
            if session.proc is None:
                self._spawn(session)
            if session.closed:
                raise ToolError("the session was closed")
            return self._run(session, code, timeout_s)

    def restart(self, session_id: str) -> None:
        """Kills the session's interpreter and every process of the session; the next call starts a fresh one in
        the same working directory (its files are kept). Nothing happens for an unknown session."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is not None:
            with session.lock:
                self._terminate(session)

    def session_end(self, session_id: str) -> None:
        """Kills every process of the session, waits for them, and removes its working directory. Idempotent.

        Safe to call while a call of the session is running in another thread: that call ends at once with a
        `ToolError`.
        """
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return
        session.closed = True
        self._terminate(session)  # unblocks a running call without waiting for its lock
        with session.lock:
            self._destroy(session)

    def session_info(self, session_id: str) -> SandboxSessionInfo | None:
        """Diagnostics of a live session (working directory, uid, process ids), or None if it is not live."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            return None
        return SandboxSessionInfo(session.workdir, session.uid, session.pids)

    def close(self) -> None:
        """Ends every live session."""
        with self._lock:
            ids = list(self._sessions)
        for session_id in ids:
            self.session_end(session_id)

    # ------------------------------------------------------------------------------------------ isolation

    def _resolve_mode(self) -> IsolationMode:
        if self._mode is None:
            self._mode = resolve_isolation(self.requested_isolation, self._run_probe)
        return self._mode

    def _run_probe(self, mode: IsolationMode) -> str:
        """Runs `PROBE_CODE` in a throwaway session in `mode` and returns its output. Raises `ToolError`."""
        session = None
        try:
            session = self._new_session(f"probe-{mode.isolation.mode}", mode)
            with session.lock:
                self._spawn(session)
                return self._run(session, PROBE_CODE, timeout_s=max(self.timeout_s, self.startup_timeout_s))
        finally:
            if session is not None:
                session.closed = True
                with session.lock:
                    self._destroy(session)

    # ------------------------------------------------------------------------------------------ sessions

    def _placement(self, session_id: str, mode: IsolationMode) -> SessionPlacement | None:
        """Where session `session_id` runs when an owner keeps its directory (a subclass's hook), or None: in a
        fresh temporary directory with a uid of its own, both removed by `session_end`."""
        return None

    def _new_session(self, session_id: str, mode: IsolationMode) -> _Session:
        placement = self._placement(session_id, mode)
        if placement is not None:
            return _Session(session_id, placement.workdir, placement.uid, None, mode, placement=placement)
        uid = lock_fd = None
        if mode.drop_uid:
            uid, lock_fd = reserve_uid()
        try:
            workdir = tempfile.mkdtemp(prefix="agentic-rl-sandbox-")
            if uid is not None:
                os.chown(workdir, uid, uid)
        except OSError as exc:
            if lock_fd is not None:
                os.close(lock_fd)
            raise ToolUnavailableError(f"could not create the sandbox working directory: {exc}") from exc
        return _Session(session_id, os.path.realpath(workdir), uid, lock_fd, mode)

    def _environment(self, workdir: str) -> dict[str, str]:
        venv_bin = os.path.join(os.path.realpath(sys.prefix), "bin")  # where a private root shows a symlinked venv
        dirs = [os.path.dirname(sys.executable), venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]
        path = os.pathsep.join(dict.fromkeys(dirs))
        env = {"PATH": path, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        # BLAS/OpenMP pools would exceed RLIMIT_NPROC / RLIMIT_AS on many-core machines
        env.update(dict.fromkeys(["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"], "1"))
        return env

    def _spawn(self, session: _Session) -> None:
        """Starts the session's interpreter and waits for its handshake. Caller holds `session.lock`."""
        mode = session.mode
        config = {
            "workdir": session.workdir,
            "uid": session.uid,
            "private_root": mode.isolation.private_root,
            "pid_namespace": mode.isolation.pid_namespace,
            "can_kill_all": mode.isolation.pid_namespace or session.uid is not None,
            "memory_limit_mb": self.memory_limit_mb,
            "cpu_time_limit_s": max(1, math.ceil(self.cpu_time_limit_s)),
            "max_processes": self.max_processes if mode.isolation.process_limit else None,
            "max_file_mb": self.max_file_mb,
            "max_output_bytes": min(self.max_output_bytes, self.max_file_mb * 1024 * 1024),
            **(session.placement.worker_options if session.placement is not None else {}),
        }
        env = self._environment(session.workdir)
        if session.placement is not None and session.placement.tmpdir is not None:
            env["TMPDIR"] = env["HOME"] = session.placement.tmpdir
        command = [*mode.unshare_args, "--", sys.executable, "-I", _WORKER_PATH, json.dumps(config)]
        if not mode.unshare_args:
            command = command[1:]
        with session.proc_lock:
            if session.closed:
                raise ToolError("the session was closed")
            try:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    cwd=session.workdir,
                    start_new_session=True,
                    close_fds=True,
                    bufsize=0,
                )
            except OSError as exc:
                raise ToolUnavailableError(f"could not start the Python sandbox: {exc}") from exc
            session.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            hello = read_frame(proc.stdout.fileno(), deadline, 1 << 16)
        except (TimeoutError, EOFError, ProtocolError) as exc:
            stderr = self._terminate(session)
            what = "timed out" if isinstance(exc, TimeoutError) else "failed"
            raise ToolUnavailableError(f"the Python sandbox {what} while starting: {exc} {stderr}".strip()) from exc
        if not hello.get("ready"):
            self._terminate(session)
            raise ToolUnavailableError(f"the Python sandbox failed to start: {hello.get('error', 'unknown error')}")
        session.pids = process_tree(proc.pid)

    def _run(self, session: _Session, code: str, timeout_s: float | None = None) -> str:
        """Sends one call and waits for its answer. Caller holds `session.lock`; the interpreter is running."""
        proc = session.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise ToolError("the session was closed")
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        max_frame = 6 * self.max_output_bytes + (1 << 16)
        try:
            write_frame(proc.stdin.fileno(), {"code": code}, deadline)
            reply = read_frame(proc.stdout.fileno(), deadline, max_frame)
        except TimeoutError:
            self._terminate(session)
            if session.closed:
                raise ToolError("the session was closed") from None
            raise ToolError(
                f"execution timed out after {timeout_s:g} s; the Python process was killed and will be "
                "restarted fresh: all variables, imports and running threads/processes are lost (files in the "
                "working directory are kept)"
            ) from None
        except (EOFError, OSError, ValueError, ProtocolError) as exc:
            returncode = None
            if isinstance(exc, EOFError | BrokenPipeError) and not session.closed:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    returncode = proc.wait(timeout=1.0)  # it is exiting on its own: learn why
            self._terminate(session)
            if session.closed:
                raise ToolError("the session was closed") from None
            raise ToolError(
                f"the Python process {describe_exit(returncode, exc, session.mode.isolation.pid_namespace, self.cpu_time_limit_s)}; it will be restarted "
                "fresh: all variables and imports are lost (files in the working directory are kept)"
            ) from None
        output = reply.get("output")
        dropped = reply.get("dropped")
        if not isinstance(output, str) or not isinstance(dropped, int):
            self._terminate(session)
            raise ToolError("the Python process sent a malformed reply; it will be restarted fresh (state lost)")
        encoded = output.encode("utf-8", "replace")
        if len(encoded) > self.max_output_bytes:  # never trust the worker's cap alone; cut between characters
            shown = sandbox_worker.utf8_boundary(encoded, self.max_output_bytes)
            dropped += len(encoded) - shown
            output = encoded[:shown].decode("utf-8", "replace")
        if dropped > 0:
            output += f"\n[output truncated: {dropped} more bytes not shown (limit {self.max_output_bytes} bytes)]"
        return output if output else "(no output)"

    def _terminate(self, session: _Session) -> str:
        """Kills the session's process group and every process of its uid / PID namespace, and reaps them.

        Returns:
            Up to 2 KiB of what the process wrote to its stderr before the worker took it over (startup errors).
        """
        with session.proc_lock:
            proc, session.proc = session.proc, None
            pids, session.pids = session.pids, ()
            if proc is None:
                return ""
            tree = pids or process_tree(proc.pid)
            if proc.returncode is None:  # not reaped yet, so its pid (and process group) is still ours
                if session.mode.isolation.pid_namespace and len(tree) > 1 and parent_pid(tree[1]) == proc.pid:
                    # Kill the namespace's PID 1: the kernel kills the rest of the namespace and `unshare` reaps it
                    # and exits, so no zombie is left for the host's init to collect.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(tree[1], signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=_KILL_GRACE_S / 2)
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=_KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.error("sandbox process %d of session %s did not die", proc.pid, session.session_id)
            stderr = b""
            if proc.stderr is not None:
                with contextlib.suppress(OSError):
                    os.set_blocking(proc.stderr.fileno(), False)
                    stderr = os.read(proc.stderr.fileno(), 2048) or b""
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            deadline = time.monotonic() + _KILL_GRACE_S
            if session.uid is not None:
                sweep_uid(session.uid, deadline)
            while any(pid_alive(pid) for pid in tree[1:]) and time.monotonic() < deadline:
                time.sleep(0.01)  # the namespace's processes are dying after its PID 1
        return stderr.decode("utf-8", "replace").strip()

    def _destroy(self, session: _Session) -> None:
        """Kills the interpreter, removes the working directory and releases the uid (unless an owner keeps them:
        `SessionPlacement`). Caller holds `session.lock`."""
        self._terminate(session)
        if session.placement is None:
            remove_tree(session.workdir)
        if session.uid_lock_fd is not None:
            os.close(session.uid_lock_fd)
            session.uid_lock_fd = None
