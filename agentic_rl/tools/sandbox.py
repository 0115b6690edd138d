"""A stateful Python tool: one persistent, sandboxed interpreter per session (trajectory).

Each session runs the worker program `agentic_rl.tools.sandbox_worker` in its own process, by path from the package
(`sys.executable -I <its file> <JSON config>`; that module says why no copy is needed). The parent sends the code
of each call as a length-prefixed JSON frame on the worker's stdin; the worker executes it in a persistent
globals dict and answers with the captured stdout + stderr (a traceback for an exception, the repr of a final
expression), capped inside the worker. Variables, imports and files in the private working directory persist
between the calls of a session; `session_end` kills every process of the session and removes the directory.

Isolation: the strongest mode that works on the machine is chosen once per process (`isolation="auto"`) by
starting a real probe worker, and a warning is logged once for whatever is missing:

* ``"namespaces"`` (root with util-linux ``unshare``): new mount, network, PID, IPC and UTS namespaces. The network
  namespace holds only a loopback interface that is down, so no connection (not even to 127.0.0.1) succeeds.
  ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are private tmpfs mounts; directories the sandbox user could not traverse
  (e.g. ``/root`` when the interpreter lives in ``/root/.pyenv``) are hidden under a tmpfs, with only the
  interpreter's directories bound back. The worker then drops to a per-session unprivileged uid/gid (no
  supplementary groups, ``no_new_privs``), so it cannot write to root-owned places (``/etc``, ``/usr``, ...),
  and ``RLIMIT_NPROC`` bounds the processes of that session alone. A supervisor is PID 1 of the namespace: it reaps
  orphans, and when it dies the kernel kills everything left in the namespace.
* ``"userns"`` (non-root with unprivileged user namespaces): the same namespaces inside a new user namespace;
  the code runs as the calling user (mapped to root inside), so it can write wherever that user can outside the
  private ``/tmp``; ``RLIMIT_NPROC`` is counted per user namespace, so per session.
* ``"uid"`` (root without usable namespaces): per-session unprivileged uid and rlimits only. Network access is
  NOT blocked and ``/tmp`` is shared (files there are owned by the session uid). Leftover processes are found and
  killed by their uid.
* ``"none"``: rlimits (without ``RLIMIT_NPROC``) in a new process group only, as the calling user; every missing
  guarantee is logged as a warning. Fork bombs are not bounded and processes that leave the group survive.

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
import errno
import fcntl
import json
import logging
import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools import sandbox_worker
from agentic_rl.tools.base import StatefulTool

__all__ = [
    "SANDBOX_UID_BASE",
    "SANDBOX_UID_COUNT",
    "SandboxIsolation",
    "SandboxSessionInfo",
    "SandboxTool",
]

logger = logging.getLogger(__name__)

SANDBOX_UID_BASE = 1_900_000_000
"""First uid (and gid) given to sandbox sessions when running as root; an unallocated range on common systems."""
SANDBOX_UID_COUNT = 4096
"""Number of uids in the sandbox range: the most concurrent sessions per machine when running as root."""

_HEADER = sandbox_worker.HEADER  # the frame format is the worker's
_WORKER_PATH = os.path.abspath(sandbox_worker.__file__)
_KILL_GRACE_S = 5.0  # time to kill, reap and sweep a session's processes
_PROBE_CODE = "import fractions, json\nprint(sum(range(5)))"
_ISOLATION_MODES = ("auto", "namespaces", "userns", "uid", "none")


# ------------------------------------------------------------------------------------------------- public records


@dataclass(frozen=True)
class SandboxIsolation:
    """What the chosen isolation mode guarantees on this machine.

    Attributes:
        mode: ``"namespaces"``, ``"userns"``, ``"uid"`` or ``"none"`` (see the module docstring).
        network: True when the code runs in an empty network namespace (no connection succeeds).
        pid_namespace: True when the session has its own PID namespace (all its processes die with it).
        private_tmp: True when ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are private to the session.
        unprivileged_uid: True when the code runs as a per-session unprivileged uid (cannot write root-owned files).
        process_limit: True when ``RLIMIT_NPROC`` bounds the processes of this session alone.
    """

    mode: str
    network: bool
    pid_namespace: bool
    private_tmp: bool
    unprivileged_uid: bool
    process_limit: bool


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


@dataclass(frozen=True)
class _Mode:
    isolation: SandboxIsolation
    unshare_args: tuple[str, ...]  # empty: no `unshare` prefix
    drop_uid: bool


def _mode(name: str, unshare: str | None) -> _Mode:
    ns = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
    if name == "namespaces":
        return _Mode(SandboxIsolation(name, True, True, True, True, True), (unshare or "unshare", *ns), True)
    if name == "userns":
        args = (unshare or "unshare", "--user", "--map-root-user", *ns)
        return _Mode(SandboxIsolation(name, True, True, True, False, True), args, False)
    if name == "uid":
        return _Mode(SandboxIsolation(name, False, False, False, True, True), (), True)
    return _Mode(SandboxIsolation("none", False, False, False, False, False), (), False)


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
_MODE_CACHE: dict[str, tuple[_Mode | None, str]] = {}  # mode name -> (mode if it works, why not)
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    with _MODE_LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    logger.warning(message)


# ------------------------------------------------------------------------------------------------- uid slots


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


def _reserve_uid() -> tuple[int, int]:
    """Reserves a free sandbox uid with an exclusive flock; returns (uid, lock fd)."""
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
        if _uid_processes(uid):  # a leftover of a crashed process: do not reuse it
            os.close(fd)
            continue
        return uid, fd
    raise ToolError(f"all {SANDBOX_UID_COUNT} sandbox uids are in use")


# ------------------------------------------------------------------------------------------------- /proc helpers


def _proc_status(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes any of whose uids is `uid`."""
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


def _process_tree(root: int) -> tuple[int, ...]:
    """`root` and its live descendants, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] not in ("Z", "X"):
            parents.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, ()))
    return tuple(tree)


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# ------------------------------------------------------------------------------------------------- framing


class _ProtocolError(Exception):
    pass


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if not poller.poll(max(1, math.ceil(remaining * 1000))):
            continue
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int, deadline: float, max_bytes: int) -> dict[str, Any]:
    (length,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if length > max_bytes:
        raise _ProtocolError(f"frame of {length} bytes (limit {max_bytes})")
    try:
        message = json.loads(_read_exact(fd, length, deadline))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _ProtocolError(f"malformed frame: {exc}") from exc
    if not isinstance(message, dict):
        raise _ProtocolError("frame is not a JSON object")
    return message


def _write_frame(fd: int, message: dict[str, Any], deadline: float) -> None:
    body = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
    view = memoryview(_HEADER.pack(len(body)) + body)
    poller = select.poll()
    poller.register(fd, select.POLLOUT | select.POLLERR)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if not poller.poll(max(1, math.ceil(remaining * 1000))):
            continue
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue


# ------------------------------------------------------------------------------------------------- the tool


@dataclass
class _Session:
    session_id: str
    workdir: str
    uid: int | None
    uid_lock_fd: int | None
    mode: _Mode
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call at a time
    proc_lock: threading.Lock = field(default_factory=threading.Lock)  # guards proc: spawn vs. kill
    proc: subprocess.Popen[bytes] | None = None
    pids: tuple[int, ...] = ()
    closed: bool = False


class SandboxTool(StatefulTool):
    """Runs Python code in a persistent, sandboxed interpreter: one process per session (trajectory).

    Variables, imports and files in the session's private working directory persist between calls of the same
    session. The observation is the captured stdout + stderr of the call (plus the repr of a final expression
    statement), or the traceback of an exception it raised; it is cut to `max_output_bytes` with a
    ``[output truncated: ...]`` marker. See the module docstring for the isolation modes.

    The environment's limit for one call (`self.timeout_s`) is `timeout_s` plus `startup_timeout_s` plus a few
    seconds to kill the process, so the sandbox's own timeout message normally reaches the model first.

    Args:
        timeout_s: wall-clock limit of one call's code, in seconds. Past it the session's processes are killed,
            the next call starts a fresh interpreter, and the call raises `ToolError` saying the state was lost.
        max_output_bytes: most bytes of output returned per call (UTF-8); the worker drops the rest.
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
        if isolation not in _ISOLATION_MODES:
            raise ConfigError(f"isolation must be one of {', '.join(_ISOLATION_MODES)}; got {isolation!r}")
        if sys.platform != "linux":
            raise ConfigError("SandboxTool needs Linux")
        self.exec_timeout_s = float(timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self.memory_limit_mb = int(memory_limit_mb)
        self.cpu_time_limit_s = float(cpu_time_limit_s)
        self.max_processes = int(max_processes)
        self.max_file_mb = int(max_file_mb)
        self.max_code_bytes = int(max_code_bytes)
        self.startup_timeout_s = float(startup_timeout_s)
        self.requested_isolation = isolation
        self.timeout_s = self.exec_timeout_s + self.startup_timeout_s + _KILL_GRACE_S
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._mode: _Mode | None = None

    # ------------------------------------------------------------------------------------------ public API

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
            ToolError: if the interpreter cannot be started (or the requested isolation does not work).
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
            return self._run(session, code)

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

    def _resolve_mode(self) -> _Mode:
        if self._mode is not None:
            return self._mode
        root = os.geteuid() == 0
        if self.requested_isolation == "auto":
            names = ["namespaces", "uid", "none"] if root else ["userns", "none"]
        else:
            names = [self.requested_isolation]
        reasons = []
        for name in names:
            mode, reason = self._probe(name)
            if mode is not None:
                self._mode = mode
                self._warn_missing(mode, reasons)
                return mode
            reasons.append(f"{name}: {reason}")
        raise ToolError(f"sandbox isolation {self.requested_isolation!r} is not available: " + "; ".join(reasons))

    def _probe(self, name: str) -> tuple[_Mode | None, str]:
        with _PROBE_LOCK:
            with _MODE_LOCK:
                if name in _MODE_CACHE:
                    return _MODE_CACHE[name]
            result = self._probe_uncached(name)
            with _MODE_LOCK:
                _MODE_CACHE[name] = result
            return result

    def _probe_uncached(self, name: str) -> tuple[_Mode | None, str]:
        root = os.geteuid() == 0
        unshare = _unshare_binary()
        if name in ("namespaces", "uid") and not root:
            return None, "needs root"
        if name == "userns" and root:
            return None, "for non-root users (as root, 'namespaces' is used)"
        if name in ("namespaces", "userns") and unshare is None:
            return None, "util-linux 'unshare' not found"
        mode = _mode(name, unshare)
        session = None
        try:
            session = self._new_session(f"probe-{name}", mode)
            with session.lock:
                self._spawn(session)
                output = self._run(session, _PROBE_CODE, timeout_s=max(self.exec_timeout_s, self.startup_timeout_s))
            if output.strip() != "10":
                return None, f"probe printed {output[:200]!r}"
            logger.debug("sandbox isolation mode %r works", name)
            return mode, ""
        except ToolError as exc:
            logger.debug("sandbox isolation mode %r does not work: %s", name, exc)
            return None, str(exc)
        finally:
            if session is not None:
                session.closed = True
                with session.lock:
                    self._destroy(session)

    @staticmethod
    def _warn_missing(mode: _Mode, reasons: list[str]) -> None:
        iso = mode.isolation
        why = f" ({'; '.join(reasons)})" if reasons else ""
        if not iso.network:
            _warn_once(
                f"python sandbox (mode {iso.mode!r}): no network namespace, sandboxed code CAN reach the network{why}"
            )
        if not iso.private_tmp:
            _warn_once(f"python sandbox (mode {iso.mode!r}): /tmp is shared with the host{why}")
        if not iso.unprivileged_uid:
            who = "root" if os.geteuid() == 0 else "the calling user"
            _warn_once(f"python sandbox (mode {iso.mode!r}): code runs as {who} and can write wherever it can")
        if not iso.process_limit:
            _warn_once(f"python sandbox (mode {iso.mode!r}): no per-session process limit: fork bombs are not bounded")

    # ------------------------------------------------------------------------------------------ sessions

    def _new_session(self, session_id: str, mode: _Mode) -> _Session:
        uid = lock_fd = None
        if mode.drop_uid:
            uid, lock_fd = _reserve_uid()
        try:
            workdir = tempfile.mkdtemp(prefix="agentic-rl-sandbox-")
            if uid is not None:
                os.chown(workdir, uid, uid)
        except OSError as exc:
            if lock_fd is not None:
                os.close(lock_fd)
            raise ToolError(f"could not create the sandbox working directory: {exc}") from exc
        return _Session(session_id, os.path.realpath(workdir), uid, lock_fd, mode)

    def _environment(self, workdir: str) -> dict[str, str]:
        path = os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]))
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
            "private_mounts": mode.isolation.private_tmp,
            "pid_namespace": mode.isolation.pid_namespace,
            "can_kill_all": mode.isolation.pid_namespace or session.uid is not None,
            "memory_limit_mb": self.memory_limit_mb,
            "cpu_time_limit_s": max(1, math.ceil(self.cpu_time_limit_s)),
            "max_processes": self.max_processes if mode.isolation.process_limit else None,
            "max_file_mb": self.max_file_mb,
            "max_output_bytes": min(self.max_output_bytes, self.max_file_mb * 1024 * 1024),
        }
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
                    env=self._environment(session.workdir),
                    cwd=session.workdir,
                    start_new_session=True,
                    close_fds=True,
                    bufsize=0,
                )
            except OSError as exc:
                raise ToolError(f"could not start the Python sandbox: {exc}") from exc
            session.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            hello = _read_frame(proc.stdout.fileno(), deadline, 1 << 16)
        except (TimeoutError, EOFError, _ProtocolError) as exc:
            stderr = self._terminate(session)
            what = "timed out" if isinstance(exc, TimeoutError) else "failed"
            raise ToolError(f"the Python sandbox {what} while starting: {exc} {stderr}".strip()) from exc
        if not hello.get("ready"):
            self._terminate(session)
            raise ToolError(f"the Python sandbox failed to start: {hello.get('error', 'unknown error')}")
        session.pids = _process_tree(proc.pid)

    def _run(self, session: _Session, code: str, timeout_s: float | None = None) -> str:
        """Sends one call and waits for its answer. Caller holds `session.lock`; the interpreter is running."""
        proc = session.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise ToolError("the session was closed")
        timeout_s = self.exec_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        max_frame = 6 * self.max_output_bytes + (1 << 16)
        try:
            _write_frame(proc.stdin.fileno(), {"code": code}, deadline)
            reply = _read_frame(proc.stdout.fileno(), deadline, max_frame)
        except TimeoutError:
            self._terminate(session)
            if session.closed:
                raise ToolError("the session was closed") from None
            raise ToolError(
                f"execution timed out after {timeout_s:g} s; the Python process was killed and will be "
                "restarted fresh: all variables, imports and running threads/processes are lost (files in the "
                "working directory are kept)"
            ) from None
        except (EOFError, OSError, ValueError, _ProtocolError) as exc:
            returncode = None
            if isinstance(exc, EOFError | BrokenPipeError) and not session.closed:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    returncode = proc.wait(timeout=1.0)  # it is exiting on its own: learn why
            self._terminate(session)
            if session.closed:
                raise ToolError("the session was closed") from None
            raise ToolError(
                f"the Python process {self._describe_exit(session.mode, returncode, exc)}; it will be restarted "
                "fresh: all variables and imports are lost (files in the working directory are kept)"
            ) from None
        output = reply.get("output")
        dropped = reply.get("dropped")
        if not isinstance(output, str) or not isinstance(dropped, int):
            self._terminate(session)
            raise ToolError("the Python process sent a malformed reply; it will be restarted fresh (state lost)")
        encoded = output.encode("utf-8", "replace")
        if len(encoded) > self.max_output_bytes:  # never trust the worker's cap alone
            dropped += len(encoded) - self.max_output_bytes
            output = encoded[: self.max_output_bytes].decode("utf-8", "replace")
        if dropped > 0:
            output += f"\n[output truncated: {dropped} more bytes not shown (limit {self.max_output_bytes} bytes)]"
        return output if output else "(no output)"

    def _describe_exit(self, mode: _Mode, returncode: int | None, exc: BaseException) -> str:
        if returncode is None:
            return f"stopped answering ({type(exc).__name__}: {exc})"
        number = None
        if returncode < 0:
            number = -returncode
        elif mode.isolation.pid_namespace and 128 < returncode < 128 + 65:
            number = returncode - 128  # the PID-1 supervisor reports the executor's death by signal n as 128 + n
        if number is None:
            return f"exited with status {returncode}"
        hints = {
            signal.SIGXCPU: f"CPU time limit of {self.cpu_time_limit_s:g} s exceeded",
            signal.SIGKILL: "killed, e.g. past the CPU time limit or by the kernel's out-of-memory killer",
            signal.SIGSEGV: "segmentation fault",
        }
        hint = hints.get(number)  # type: ignore[call-overload]
        return f"died ({_signal_name(number)}{': ' + hint if hint else ''})"

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
            tree = pids or _process_tree(proc.pid)
            if proc.returncode is None:  # not reaped yet, so its pid (and process group) is still ours
                if session.mode.isolation.pid_namespace and len(tree) > 1 and _parent_pid(tree[1]) == proc.pid:
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
                self._sweep_uid(session.uid, deadline)
            while any(_pid_alive(pid) for pid in tree[1:]) and time.monotonic() < deadline:
                time.sleep(0.01)  # the namespace's processes are dying after its PID 1
        return stderr.decode("utf-8", "replace").strip()

    @staticmethod
    def _sweep_uid(uid: int, deadline: float) -> None:
        """SIGKILLs every process of `uid` until none is left (the uid belongs to this session alone)."""
        while True:
            pids = _uid_processes(uid)
            if not pids:
                return
            if time.monotonic() > deadline:
                logger.error("sandbox processes %s of uid %d survived SIGKILL", pids, uid)
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def _destroy(self, session: _Session) -> None:
        """Kills the interpreter, removes the working directory and releases the uid. Caller holds `session.lock`."""
        self._terminate(session)

        def retry_writable(function: Any, path: str, _exc: Any) -> None:
            with contextlib.suppress(OSError):
                os.chmod(os.path.dirname(path), 0o700)
                os.chmod(path, 0o700)
            with contextlib.suppress(FileNotFoundError):
                function(path)

        try:
            if sys.version_info >= (3, 12):
                shutil.rmtree(session.workdir, onexc=retry_writable)
            else:
                shutil.rmtree(session.workdir, onerror=retry_writable)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                logger.warning("could not remove sandbox directory %s: %s", session.workdir, exc)
        if session.uid_lock_fd is not None:
            os.close(session.uid_lock_fd)
            session.uid_lock_fd = None
