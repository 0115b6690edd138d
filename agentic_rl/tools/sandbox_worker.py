"""The worker program of `agentic_rl.tools.sandbox`: one persistent, sandboxed Python interpreter.

`SandboxTool` runs this file by path, ``[sys.executable, "-I", <this file>, <JSON config>]`` (behind ``unshare``
in the namespace modes). It sets up the sandbox (an overlay on the working directory if asked, a minimal read-only
root, rlimits, ``no_new_privs``, the drop to the session's uid), answers a ``{"ready": ...}`` frame, then executes
each ``{"code": ...}`` frame read from stdin in one persistent globals dict and answers ``{"output": ...,
"dropped": ...}`` with the captured stdout + stderr. Frames are a 4-byte big-endian length, then UTF-8 JSON.

Constraints, because the program runs isolated (``-I``: no environment variables, no user site, not even this
file's directory on ``sys.path``), possibly as another uid inside new namespaces:

* only the standard library is imported, never `agentic_rl` (which is not importable there);
* importing the module has no side effects (`main` runs only under ``__name__ == "__main__"``), so tests import its
  helpers directly; the user's code runs in a fresh ``__main__`` module with no file, so a ``spawn`` child does
  not look for this one (it is not inside the sandbox's root);
* the file (and a ``preload`` module's) is read from where the package is installed, with no copy, at start-up, as
  the user that runs `SandboxTool` and before `setup` changes mounts or drops privileges, so the session's uid never
  needs to read it (the package may live under ``/root``). Nothing reads it again afterwards: the worker's frames
  are cut from tracebacks by their globals, not looked up by file name.
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
import types
import warnings
from typing import Any

HEADER = struct.Struct(">I")
"""The frame header: the body's length in bytes, big-endian."""

IS_FORK_CHILD = False
"""True in a process forked by the user's code: it must never answer the parent."""

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 8, 32, 4096, 16384
_MNT_DETACH = 2
_ST_TO_MS = {
    os.ST_NOSUID: _MS_NOSUID,
    os.ST_NODEV: _MS_NODEV,
    os.ST_NOEXEC: _MS_NOEXEC,
    os.ST_NOATIME: 1024,
    os.ST_NODIRATIME: 2048,
    os.ST_RELATIME: 1 << 21,
}
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""The host's program and library directories, visible read-only in the sandbox's root (symlinks followed)."""
ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "mime.types", "alternatives")
"""The entries of the host's ``/etc`` visible read-only in the sandbox (plus a generated passwd and group)."""
DEV_NODES = ("null", "zero", "full", "random", "urandom")
"""The host devices visible in the sandbox's ``/dev``."""
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _CAP_VERSION_3 = 38, 24, 0x20080522


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


def utf8_boundary(data: bytes, limit: int) -> int:
    """Where to cut `data` to keep at most `limit` bytes without splitting a UTF-8 sequence.

    Returns:
        The largest ``n <= limit`` (``len(data)`` when it is shorter) such that ``data[n]`` does not continue a
        multi-byte character; for bytes that are not UTF-8, at most 3 bytes before `limit`.
    """
    if limit >= len(data):
        return len(data)
    n = max(limit, 0)
    while n > 0 and limit - n < 3 and data[n] & 0xC0 == 0x80:
        n -= 1
    return n


# ------------------------------------------------------------------------------------------------------- setup


def under(path: str, top: str) -> bool:
    """True when `path` is `top` or inside it (plain string comparison of normalized absolute paths)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _mount(libc: Any, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or src} on {dst}: {os.strerror(err)}")


def interpreter_dirs() -> set[str]:
    """The directories of the interpreter and its libraries: its prefixes and its binary's directory.

    Entries of `sys.path` outside these (e.g. a project checkout added by an editable install) are left out: the
    sandbox must not see them.
    """
    found = set()
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        os.path.dirname(os.path.realpath(sys.executable)),
    ]
    for p in candidates:
        real = os.path.realpath(p) if p else ""
        if os.path.isdir(real) and real != "/":
            found.add(real)
    return found


def root_binds() -> list[tuple[str, str]]:
    """What the sandbox's root holds, read-only: ``(path inside, real host path)`` pairs, no path inside another.

    The system's program and library directories, the interpreter's directories, a few files of ``/etc`` the C
    library and Python read (dynamic linker cache, time zone, name service switch, MIME types) and the harmless
    devices of ``/dev``. Paths that do not exist here are skipped.
    """
    pairs = [(p, os.path.realpath(p)) for p in SYSTEM_DIRS]
    pairs += [(p, p) for p in sorted(interpreter_dirs())]
    pairs += [(f"/etc/{name}", os.path.realpath(f"/etc/{name}")) for name in ETC_ENTRIES]
    pairs += [(f"/dev/{name}", f"/dev/{name}") for name in DEV_NODES]
    binds: list[tuple[str, str]] = []
    for inside, real in pairs:
        if os.path.exists(real) and not any(under(inside, other) for other, _ in binds):
            binds = [(o, r) for o, r in binds if not under(o, inside)] + [(inside, real)]
    return sorted(binds)


def _bind(libc: Any, fd: int, target: str, read_only: bool) -> None:
    """Bind the host path open as O_PATH `fd` on `target`, then make it read-only keeping the source's mount flags."""
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(libc, f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC, None)
    if read_only:  # flags the source mount has must stay set, or a user namespace refuses the remount
        kept = sum(ms for st, ms in _ST_TO_MS.items() if os.fstatvfs(fd).f_flag & st)
        _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept, None)


def _pivot_root(libc: Any, new_root: str, put_old: str) -> None:
    machine = os.uname().machine
    number = _PIVOT_ROOT.get(machine)
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {machine!r}")
    if libc.syscall(number, new_root.encode(), put_old.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root: {os.strerror(err)}")


def private_root(workdir: str, uid: int | None, size_mb: int) -> None:
    """Replace the root by a minimal read-only one; the host's root is unmounted, so nothing else is reachable.

    The new root is a read-only tmpfs holding `root_binds`, private tmpfs ``/tmp``, ``/var/tmp`` and ``/dev/shm``,
    a fresh ``/proc``, a generated ``/etc/passwd`` and ``/etc/group``, and `workdir` (read-write, at its host path).
    Must run in new mount and PID namespaces, before the privilege drop. The new root is built on the private
    mount point ``/tmp``; every host path is opened first, so one below ``/tmp`` (the working directory) is found.
    """
    libc = _libc()
    binds = root_binds()
    fds = [(inside, os.open(real, os.O_PATH | os.O_CLOEXEC)) for inside, real in binds]
    work_fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    new_root = os.path.realpath("/tmp")
    _mount(libc, "tmpfs", new_root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755,size=1m")
    old_umask = os.umask(0o022)
    try:
        for d in ("/tmp", "/var/tmp", "/dev/shm"):  # first: an interpreter below /tmp is bound on top of them
            os.makedirs(new_root + d, exist_ok=True)
            _mount(libc, "tmpfs", new_root + d, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={size_mb}m")
        for inside, fd in fds:
            _bind(libc, fd, new_root + inside, read_only=True)
            os.close(fd)
        _bind(libc, work_fd, new_root + workdir, read_only=False)
        os.close(work_fd)
        os.makedirs(new_root + "/proc")
        _mount(libc, "proc", new_root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            os.symlink(target, f"{new_root}/dev/{name}")
        me = os.getuid() if uid is None else uid
        os.makedirs(new_root + "/etc", exist_ok=True)
        with open(new_root + "/etc/passwd", "w") as fh:
            fh.write(f"root:x:0:0:root:/:/bin/sh\nsandbox:x:{me}:{me}:sandbox:{workdir}:/bin/sh\n")
        with open(new_root + "/etc/group", "w") as fh:
            fh.write(f"root:x:0:\nsandbox:x:{me}:\n")
        os.mkdir(new_root + "/.host")
        _pivot_root(libc, new_root, new_root + "/.host")
        os.chdir("/")
        if libc.umount2(b"/.host", _MNT_DETACH) != 0:
            raise OSError(ctypes.get_errno(), "umount the host's root")
        os.rmdir("/.host")
        _mount(libc, None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    finally:
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


def drop_capabilities() -> None:
    """Drop every capability of this process, its bounding set included.

    Neither this process nor a program it runs (as uid 0 of a user namespace) can then mount (remount the read-only
    root writable) or override file permissions.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable of capabilities 0-31, then of 32-63
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def own_tree(top: str, uid: int) -> None:
    """Give `top` and all below it to `uid` (user and group), links not followed; entries it owns are skipped."""
    for parent, dirs, files in os.walk(top):
        for path in [parent, *(os.path.join(parent, name) for name in dirs + files)]:
            st = os.lstat(path)
            if (st.st_uid, st.st_gid) != (uid, uid):
                os.lchown(path, uid, uid)


def mount_overlay(spec: dict[str, str], workdir: str, metacopy: bool) -> None:
    """Mount an overlay on `workdir` in this process's mount namespace: ``lower`` below, changes in ``upper``,
    ``work`` its scratch directory; `metacopy`: a change of owner copies up metadata only, not the data."""
    escaped = {key: spec[key].replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:") for key in spec}
    options = ",".join(f"{key}dir={escaped[key]}" for key in ("lower", "upper", "work"))
    _mount(_libc(), "overlay", workdir, "overlay", _MS_NOSUID | _MS_NODEV, options + ",metacopy=on" * metacopy)


def setup(cfg: dict[str, Any]) -> None:
    """Runs before any user code: namespaces' mounts (with ``overlay``, one on the working directory), the working
    directory given to the session's uid (``own_workdir``), limits, privilege drop. Raises on failure."""
    uid = cfg["uid"]
    workdir = cfg["workdir"]
    if cfg.get("overlay"):
        mount_overlay(cfg["overlay"], workdir, metacopy=uid is not None)
    if uid is not None and cfg.get("own_workdir"):
        own_tree(workdir, uid)
    if cfg["private_root"]:
        private_root(workdir, uid, cfg["max_file_mb"])
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
    if uid is None and cfg["private_root"]:  # uid 0 of a user namespace: it could undo the read-only mounts
        drop_capabilities()
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
        data = s[:room].encode("utf-8", "backslashreplace")  # at most `room` characters: at least what fits
        if len(s) <= room and len(data) <= room:
            write_all(self.fd, data)
            return len(s)
        head = data[: utf8_boundary(data, room)]  # whole characters only; nothing is appended after a cut
        write_all(self.fd, head)
        self.full = True
        self.dropped += utf8_len(s) - len(head)
        return len(s)


def shown_output(data: bytes, cap: int) -> tuple[str, int]:
    """The text shown for the captured bytes `data`: whole characters from its start, at most `cap` UTF-8 bytes.

    Bytes that are not UTF-8 show as U+FFFD (3 bytes each), so the raw prefix shown is shortened until the text
    fits.

    Returns:
        ``(text, shown)``: the text, and how many bytes of `data` it shows (``len(data) - shown`` are left out).
    """
    shown = utf8_boundary(data, cap)
    if len(data[:shown].decode("utf-8", "replace").encode()) > cap:
        low, high = 0, shown  # the longest raw prefix whose text fits: `low` always fits
        while low < high:
            mid = (low + high + 1) // 2
            if len(data[: utf8_boundary(data, mid)].decode("utf-8", "replace").encode()) <= cap:
                low = mid
            else:
                high = mid - 1
        shown = utf8_boundary(data, low)
    return data[:shown].decode("utf-8", "replace"), shown


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


def executor(cfg: dict[str, Any], proto_in: int, proto_out: int, preload: tuple[str, str] | None = None) -> None:
    """Answer the parent's calls until it closes the protocol (then exit). ``import_workdir`` (default True) puts
    the working directory on `sys.path`; `preload` is ``(name, source)`` of a module to import in calls (`main`)."""
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
    if cfg.get("import_workdir", True):
        sys.path.insert(0, cfg["workdir"])
    sys.modules["agentic_rl_sandbox_worker"] = sys.modules[__name__]
    # The user's globals are the `__main__` module: pickle finds functions defined in cells (fork pools), and
    # a `spawn` child does not look for the worker's file, which is not inside the sandbox's root.
    user_main = types.ModuleType("__main__")  # the worker's functions keep their own globals
    user_main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = user_main
    user_globals: dict[str, Any] = vars(user_main)
    if preload is not None:  # it may import this module's helpers as ``agentic_rl_sandbox_worker``
        sys.modules[preload[0]] = module = types.ModuleType(preload[0])
        exec(compile(preload[1], preload[0], "exec"), vars(module))
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
        text, shown = shown_output(os.pread(capture_fd, min(size, cap + 1), 0), cap)  # +1: is byte `cap` a cut?
        write_frame(proto_out, {"output": text, "dropped": size - shown + stream.dropped})


def main(argv: list[str]) -> None:
    """Set up the sandbox described by the JSON config `argv[1]`, then serve calls on stdin / stdout."""
    proto_in, proto_out = os.dup(0), os.dup(1)  # non-inheritable copies: children never see the protocol
    try:
        cfg = json.loads(argv[1])
        preload = None
        if cfg.get("preload"):  # ``{"name", "path"}``, read now: after `setup` the file may be out of sight
            with open(cfg["preload"]["path"], encoding="utf-8") as fh:
                preload = (cfg["preload"]["name"], fh.read())
        setup(cfg)
    except BaseException as exc:
        write_frame(proto_out, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    if cfg["pid_namespace"]:
        child = os.fork()
        if child:
            supervise(child)
    try:
        executor(cfg, proto_in, proto_out, preload)
    except BaseException as exc:
        if IS_FORK_CHILD:
            os._exit(1)
        try:
            write_frame(proto_out, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(1)


if __name__ == "__main__":
    main(sys.argv)
