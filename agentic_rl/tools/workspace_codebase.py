"""The code base a coding workspace starts from: a local folder, or an archive unpacked once per run.

A task names its code base in ``task["workspace"]``: a folder, or an archive (``.tar``, ``.tar.gz`` / ``.tgz``,
``.tar.bz2``, ``.tar.xz``, ``.zip``) unpacked with the standard library into the run's cache, once per archive
(its path, size and modification time). A member that would land outside the folder is refused: an absolute
name, a ``..`` that climbs out, a link that points out, a device or pipe (tar's ``"data"`` extraction filter, and
the same checks for zip names). An archive whose members all sit under one top folder (as ``git archive --prefix``
and GitHub write them) has that folder as its root. Bounded: a code base over `max_bytes` (regular files' sizes,
summed; for an archive, the sizes its members declare, before anything is written) is refused, and so is a folder
holding a device, pipe or socket (a copy would block on a pipe).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import threading
import zipfile
from pathlib import PurePosixPath

from agentic_rl.errors import ConfigError

__all__ = ["ARCHIVE_SUFFIXES", "CodebaseCache", "copy_codebase"]

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")
"""The archive names a task's ``workspace`` may end with."""


def _tree_size(top: str, max_bytes: int, source: str) -> int:
    """Bytes in the regular files below `top`, links not followed. Raises `ConfigError` past `max_bytes` or for a
    special file."""
    total = 0
    for parent, dirs, files in os.walk(top):
        for name in dirs + files:
            st = os.lstat(os.path.join(parent, name))
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                relative = os.path.relpath(os.path.join(parent, name), top)
                raise ConfigError(f"workspace {source!r} holds {relative!r}, which is not a file, folder or link")
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        if total > max_bytes:
            raise ConfigError(f"workspace {source!r} holds over {max_bytes / 2**20:g} MiB (max_codebase_mb)")
    return total


def _escapes(name: str) -> bool:
    """Whether an archive member's name is absolute or climbs out of the folder it is unpacked into."""
    path = PurePosixPath(name.replace("\\", "/"))
    return path.is_absolute() or ".." in path.parts or (len(name) > 1 and name[1] == ":")


def _unpack_tar(archive: str, dest: str, max_bytes: int) -> None:
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            if _escapes(member.name):
                raise ConfigError(f"archive {archive!r}: member {member.name!r} would land outside the workspace")
        if sum(m.size for m in members if m.isfile()) > max_bytes:
            raise ConfigError(f"archive {archive!r} unpacks to over {max_bytes / 2**20:g} MiB (max_codebase_mb)")
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise ConfigError(f"archive {archive!r}: {exc}") from None


def _unpack_zip(archive: str, dest: str, max_bytes: int) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            if _escapes(info.filename):
                raise ConfigError(f"archive {archive!r}: member {info.filename!r} would land outside the workspace")
        if sum(info.file_size for info in infos) > max_bytes:
            raise ConfigError(f"archive {archive!r} unpacks to over {max_bytes / 2**20:g} MiB (max_codebase_mb)")
        zf.extractall(dest)


def _single_top(folder: str) -> str:
    """`folder`, or its only entry when that is a folder (not a link) and nothing else is there."""
    entries = os.listdir(folder)
    if len(entries) == 1:
        only = os.path.join(folder, entries[0])
        if os.path.isdir(only) and not os.path.islink(only):
            return only
    return folder


class CodebaseCache:
    """Code bases resolved to folders, archives unpacked once into `cache_dir`; safe to share between threads.

    Args:
        cache_dir: where archives are unpacked (the run's own directory; removed with it).
        max_bytes: the largest code base accepted, in bytes.
    """

    def __init__(self, cache_dir: str, max_bytes: int) -> None:
        self.cache_dir = cache_dir
        self.max_bytes = max_bytes
        self._folders: dict[tuple[str, int, int], str] = {}
        self._locks: dict[tuple[str, int, int], threading.Lock] = {}
        self._lock = threading.Lock()

    def folder(self, source: str | os.PathLike[str]) -> str:
        """The real path of the folder holding the code base `source` (a folder, or an archive unpacked now or
        earlier). A folder is checked once per run: later changes to it are not seen by the bound.

        Raises:
            ConfigError: for a missing path, a file that is not an archive, an archive that cannot be read or that
                would write outside its folder, a code base over the bound or holding a special file.
        """
        path = os.path.realpath(os.path.expanduser(os.fspath(source)))
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ConfigError(f"workspace {os.fspath(source)!r} cannot be read: {exc.strerror}") from None
        key = (path, st.st_size if not stat.S_ISDIR(st.st_mode) else -1, st.st_mtime_ns)
        with self._lock:
            if key in self._folders:
                return self._folders[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one unpacking per archive; other threads wait for it
            with self._lock:
                if key in self._folders:
                    return self._folders[key]
            if stat.S_ISDIR(st.st_mode):
                _tree_size(path, self.max_bytes, os.fspath(source))
                folder = path
            else:
                folder = self._unpack(path, hashlib.sha256(repr(key).encode()).hexdigest()[:16])
            with self._lock:
                self._folders[key] = folder
            return folder

    def _unpack(self, archive: str, name: str) -> str:
        if not archive.lower().endswith(ARCHIVE_SUFFIXES):
            raise ConfigError(
                f"workspace {archive!r} is neither a folder nor an archive ({', '.join(ARCHIVE_SUFFIXES)})"
            )
        os.makedirs(self.cache_dir, mode=0o711, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{name}-", dir=self.cache_dir)
        try:
            if archive.lower().endswith(".zip"):
                _unpack_zip(archive, staging, self.max_bytes)
            else:
                _unpack_tar(archive, staging, self.max_bytes)
            os.chmod(staging, 0o755)
            final = os.path.join(self.cache_dir, name)
            os.rename(staging, final)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ConfigError(f"archive {archive!r} cannot be unpacked: {type(exc).__name__}: {exc}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return _single_top(final)


def copy_codebase(folder: str, workdir: str) -> None:
    """Copies the code base `folder` into the existing, empty `workdir` (symbolic links copied as links, modes and
    times kept)."""
    shutil.copytree(folder, workdir, symlinks=True, dirs_exist_ok=True)
