"""The worker program of `agentic_rl.tools.sandbox`: one persistent, sandboxed Python interpreter.

`SandboxTool` runs this file by path, ``[sys.executable, "-I", <this file>, <JSON config>]`` (behind ``unshare``
in the namespace modes). It sets up the sandbox (private mounts, rlimits, ``no_new_privs``, the drop to the
session's uid), answers a ``{"ready": ...}`` frame, then executes each ``{"code": ...}`` frame read from stdin in
one persistent globals dict and answers ``{"output": ..., "dropped": ...}`` with the captured stdout + stderr.
Frames are a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.

Constraints, because the program runs isolated (``-I``: no environment variables, no user site, not even this
file's directory on ``sys.path``), possibly as another uid inside new namespaces:

* only the standard library is imported, never `agentic_rl` (which is not importable there);
* importing the module has no side effects (`main` runs only under ``__name__ == "__main__"``), so tests import its
  helpers directly, and a ``spawn`` started by user code that re-imports the main module does nothing;
* the file is read from where the package is installed, with no copy: the interpreter opens and compiles it at
  start-up, as the user that runs `SandboxTool` and before `setup` changes mounts or drops privileges, so the
  session's unprivileged uid never needs to read it (the package may live under a directory such as ``/root`` that
  this uid cannot enter). Nothing in the program reads its own file again afterwards: the worker's frames are cut
  from tracebacks by their globals, not looked up by file name.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import io
import json
import linecache
import os
import resource
import select
import signal
import stat
import struct
import sys
import threading
import traceback
import warnings
from typing import Any

HEADER = struct.Struct(">I")
"""The frame header: the body's length in bytes, big-endian."""

IS_FORK_CHILD = False
"""True in a process forked by the user's code: it must never answer the parent."""

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 2, 4, 4096, 16384
_PR_SET_NO_NEW_PRIVS = 38


# ------------------------------------------------------------------------------------------------------- frames


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the blocking file descriptor `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_exact(fd: int, n: int) -> bytes | None:
    """Exactly `n` bytes from `fd`, or None when it reaches end of file first."""
    parts = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int) -> Any:
    """The next frame's decoded JSON, or None at end of file."""
    head = read_exact(fd, HEADER.size)
    if head is None:
        return None
    body = read_exact(fd, HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


def write_frame(fd: int, obj: Any) -> None:
    """Write `obj` as one frame (lone surrogates in strings are written backslash-escaped)."""
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace")
    write_all(fd, HEADER.pack(len(body)) + body)


def utf8_len(s: str) -> int:
    """The length of `s` in UTF-8 bytes (lone surrogates counted as their backslash escapes), in 64 Ki chunks."""
    if s.isascii():
        return len(s)
    return sum(len(s[i : i + 65536].encode("utf-8", "backslashreplace")) for i in range(0, len(s), 65536))


# ------------------------------------------------------------------------------------------------------- setup


def under(path: str, top: str) -> bool:
    """True when `path` is `top` or inside it (plain string comparison of normalized absolute paths)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def first_blocked(path: str, uid: int) -> str | None:
    """The first directory on `path` that `uid` (no groups) cannot traverse, or None."""
    current = "/"
    for part in ["", *(p for p in path.split("/") if p)]:
        current = os.path.join(current, part) if part else "/"
        st = os.stat(current)
        if st.st_mode & stat.S_IXOTH or (st.st_uid == uid and st.st_mode & stat.S_IXUSR):
            continue
        return current
    return None


def _mount(libc: Any, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or src} on {dst}: {os.strerror(err)}")


def interpreter_dirs() -> set[str]:
    """The existing directories the interpreter needs: its prefixes, its binary's directory and `sys.path`."""
    found = set()
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
                  os.path.dirname(os.path.realpath(sys.executable)), *sys.path]  # fmt: skip
    for p in candidates:
        if not p:
            continue
        real = os.path.realpath(p)
        if not os.path.isdir(real):
            real = os.path.dirname(real)
        if os.path.isdir(real):
            found.add(real)
    return found


def private_mounts(workdir: str, uid: int | None, size_mb: int) -> None:
    """Private tmpfs on /tmp, /var/tmp, /dev/shm and on directories `uid` cannot traverse; bind back what we need."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    overlays = {}
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        real = os.path.realpath(d)
        if os.path.isdir(real):
            overlays[real] = "1777"
    interpreter = interpreter_dirs()
    if uid is not None:
        for p in interpreter:
            blocked = first_blocked(p, uid)
            if blocked is not None and blocked != "/":
                overlays.setdefault(blocked, "755")
    tops = [o for o in overlays if not any(o != q and under(o, q) for q in overlays)]
    needed = sorted(p for p in interpreter | {os.path.realpath(workdir)} if any(under(p, o) for o in tops))
    binds = [p for p in needed if not any(p != q and under(p, q) for q in needed)]
    fds = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in binds]
    for top in tops:
        _mount(libc, "tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={overlays[top]},size={size_mb}m")
    old_umask = os.umask(0o022)
    for p, fd in fds:
        os.makedirs(p, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", p, None, _MS_BIND | _MS_REC, None)
        os.close(fd)
    os.umask(old_umask)


def set_limit(res: int, soft: int, hard: int | None = None) -> None:
    """Set an rlimit to `soft` / `hard` (default: `soft`), never above the current hard limit."""
    hard = soft if hard is None else hard
    _, cur_hard = resource.getrlimit(res)
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(res, (soft, hard))


def no_new_privs() -> None:
    """prctl(PR_SET_NO_NEW_PRIVS): neither this process nor its children can gain privileges (setuid binaries)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def setup(cfg: dict[str, Any]) -> None:
    """Runs before any user code: namespaces' mounts, limits, privilege drop. Raises on failure."""
    uid = cfg["uid"]
    workdir = cfg["workdir"]
    if cfg["private_mounts"]:
        private_mounts(workdir, uid, cfg["max_file_mb"])
    set_limit(resource.RLIMIT_AS, cfg["memory_limit_mb"] * 1024 * 1024)
    set_limit(resource.RLIMIT_CPU, cfg["cpu_time_limit_s"], cfg["cpu_time_limit_s"] + 1)
    if cfg["max_processes"] is not None:
        set_limit(resource.RLIMIT_NPROC, cfg["max_processes"])
    set_limit(resource.RLIMIT_FSIZE, cfg["max_file_mb"] * 1024 * 1024)
    set_limit(resource.RLIMIT_CORE, 0)
    try:
        no_new_privs()
    except Exception:
        if uid is not None:
            raise
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getgroups():
            raise OSError("privilege drop did not take effect")
    os.chdir(workdir)
    os.listdir(os.path.dirname(os.__file__))  # the standard library is still readable


def supervise(child: int) -> None:
    """PID 1 of the namespace: reap every orphan; exit like the executor (128 + signal) when it ends."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, 65536)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if pid == child:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.waitstatus_to_exitcode(status))


# ----------------------------------------------------------------------------------------------------- executor


class Capture(io.TextIOBase):
    """sys.stdout/sys.stderr of user code: writes to the capture file until it holds `cap` bytes, counts the rest."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap, self.dropped, self.full = fd, cap, 0, False

    def reset(self) -> None:
        self.dropped, self.full = 0, False

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fd

    def flush(self) -> None:
        pass

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = 0 if self.full else self.cap - os.fstat(self.fd).st_size
        if room <= 0:
            self.full = True  # the file only grows until the next call truncates it
            self.dropped += utf8_len(s)
            return len(s)
        if len(s) <= room:
            data = s.encode("utf-8", "backslashreplace")
            total: int | None = len(data)
        else:
            data = s[:room].encode("utf-8", "backslashreplace")
            total = None
        head = data[:room]
        write_all(self.fd, head)
        self.dropped += (utf8_len(s) if total is None else total) - len(head)
        return len(s)


def format_exception(exc: BaseException) -> str:
    """The traceback of an exception of the user's code, without the worker's own leading frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def open_capture_file(workdir: str) -> int:
    """An anonymous read-write file in `workdir` (unlinked at once where `O_TMPFILE` is not supported)."""
    try:
        return os.open(workdir, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError:  # file systems without O_TMPFILE
        path = os.path.join(workdir, f".capture-{os.getpid()}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.unlink(path)
        return fd


def run_cell(code: str, name: str, user_globals: dict[str, Any], stream: Capture) -> None:
    """Execute `code` in `user_globals`, writing a final expression's repr or the error to `stream`."""
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), name, "eval")
        body = compile(tree, name, "exec")
    except (SyntaxError, ValueError) as exc:
        stream.write("".join(traceback.format_exception_only(type(exc), exc)))
        return
    try:
        exec(body, user_globals)
        if last is not None:
            value = eval(last, user_globals)
            if value is not None:
                user_globals["_"] = value
                stream.write(repr(value) + "\n")
    except BaseException as exc:  # everything the code raises is its output
        if IS_FORK_CHILD:
            os._exit(1)
        try:
            stream.write(format_exception(exc))
        except BaseException:
            stream.write(f"{type(exc).__name__} (the traceback could not be formatted)\n")


def _start_watchdog(proto_in: int, can_kill_all: bool) -> None:
    """The parent closed our stdin (it exited or died): end the whole session, even in the middle of a call."""

    def watchdog() -> None:
        poller = select.poll()
        poller.register(proto_in, select.POLLHUP | select.POLLERR)
        while True:
            try:
                if poller.poll():
                    break
            except InterruptedError:
                continue
        if can_kill_all:
            try:
                os.kill(-1, signal.SIGKILL)  # every process of this session's uid / PID namespace, not us
            except OSError:
                pass
        os._exit(0)

    threading.Thread(target=watchdog, name="sandbox-watchdog", daemon=True).start()


def executor(cfg: dict[str, Any], proto_in: int, proto_out: int) -> None:
    """Answer the parent's calls until it closes the protocol (then exit)."""
    cap = cfg["max_output_bytes"]
    capture_fd = open_capture_file(cfg["workdir"])
    stream = Capture(capture_fd, cap)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    def after_fork_in_child() -> None:
        global IS_FORK_CHILD
        IS_FORK_CHILD = True
        for fd in (proto_in, proto_out):
            try:
                os.close(fd)
            except OSError:
                pass

    os.register_at_fork(after_in_child=after_fork_in_child)
    _start_watchdog(proto_in, cfg["can_kill_all"])
    # Python >= 3.12 warns on fork() with threads running: the only other thread is the watchdog.
    warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
    sys.argv = [""]
    sys.path.insert(0, cfg["workdir"])
    user_globals: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    write_frame(proto_out, {"ready": True, "uid": os.getuid()})
    cell = 0
    while True:
        request = read_frame(proto_in)
        if request is None:
            os._exit(0)
        cell += 1
        os.ftruncate(capture_fd, 0)
        os.lseek(capture_fd, 0, os.SEEK_SET)
        os.dup2(capture_fd, 1)
        os.dup2(capture_fd, 2)
        stream.reset()
        sys.stdout = sys.stderr = stream
        run_cell(request["code"], f"<cell {cell}>", user_globals, stream)
        if IS_FORK_CHILD:
            os._exit(0)  # a process forked by the user's code must not answer the parent
        for std in (sys.__stdout__, sys.__stderr__):
            try:
                if std is not None:
                    std.flush()
            except Exception:
                pass
        size = os.fstat(capture_fd).st_size
        data = os.pread(capture_fd, min(size, cap), 0)
        write_frame(
            proto_out, {"output": data.decode("utf-8", "replace"), "dropped": size - len(data) + stream.dropped}
        )


def main(argv: list[str]) -> None:
    """Set up the sandbox described by the JSON config `argv[1]`, then serve calls on stdin / stdout."""
    proto_in, proto_out = os.dup(0), os.dup(1)  # non-inheritable copies: children never see the protocol
    try:
        cfg = json.loads(argv[1])
        setup(cfg)
    except BaseException as exc:
        write_frame(proto_out, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    if cfg["pid_namespace"]:
        child = os.fork()
        if child:
            supervise(child)
    try:
        executor(cfg, proto_in, proto_out)
    except BaseException as exc:
        if IS_FORK_CHILD:
            os._exit(1)
        try:
            write_frame(proto_out, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(1)


if __name__ == "__main__":
    main(sys.argv)
