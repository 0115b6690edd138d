"""Tests of agentic_rl.tools.workspace_codebase: code bases from folders and archives, and what is refused."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from agentic_rl.errors import ConfigError
from agentic_rl.tools.workspace_codebase import CodebaseCache


@pytest.fixture
def cache(tmp_path: Path) -> CodebaseCache:
    return CodebaseCache(str(tmp_path / "cache"), max_bytes=1 << 20)


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def test_a_folder_is_used_in_place(cache, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("x = 1\n")
    assert cache.folder(tmp_path / "code") == str((tmp_path / "code").resolve())


@pytest.mark.parametrize("suffix, mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"), (".tar.xz", "w:xz")])
def test_a_tar_archive_is_unpacked_once_with_its_single_top_folder_as_the_root(cache, tmp_path, suffix, mode):
    archive = _tar(tmp_path / f"project{suffix}", [("project/src/a.py", b"x = 1\n"), _link("project/l", "src/a.py")], mode)
    folder = cache.folder(archive)
    assert os.path.basename(folder) == "project" and Path(folder, "src", "a.py").read_text() == "x = 1\n"
    assert os.readlink(Path(folder, "l")) == "src/a.py"
    assert cache.folder(str(archive)) == folder  # cached: not unpacked again
    assert len(os.listdir(cache.cache_dir)) == 1


def test_a_zip_archive_is_unpacked(cache, tmp_path):
    with zipfile.ZipFile(tmp_path / "p.zip", "w") as zf:
        zf.writestr("a.py", "x = 1\n")
        zf.writestr("pkg/b.py", "y = 2\n")
    folder = cache.folder(tmp_path / "p.zip")
    assert sorted(os.listdir(folder)) == ["a.py", "pkg"]


@pytest.mark.parametrize(
    "member, message",
    [
        (("/etc/evil", b"x"), "member '/etc/evil' would land outside the workspace"),
        (("a/../../evil", b"x"), "would land outside the workspace"),
        (_link("out", "/etc/passwd"), "'out' is a link to an absolute path"),
        (_link("up", "../../outside"), "'up' would link to .* which is outside the destination"),
    ],
)
def test_a_tar_member_that_escapes_the_root_is_refused(cache, tmp_path, member, message):
    archive = _tar(tmp_path / "bad.tar.gz", [("ok.txt", b"fine"), member])
    with pytest.raises(ConfigError, match=message):
        cache.folder(archive)
    assert not list((tmp_path / "cache").glob("*/ok.txt")) and not (tmp_path / "evil").exists()


def test_a_zip_member_that_escapes_the_root_is_refused(cache, tmp_path):
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
        zf.writestr("ok.txt", "fine")
        zf.writestr("../evil.txt", "x")
    with pytest.raises(ConfigError, match=r"member '\.\./evil\.txt' would land outside the workspace"):
        cache.folder(tmp_path / "bad.zip")


def test_a_code_base_over_the_bound_is_refused_before_it_is_written(cache, tmp_path):
    archive = _tar(tmp_path / "big.tar", [("big.bin", b"\0" * ((1 << 20) + 1))], "w")
    with pytest.raises(ConfigError, match=r"unpacks to over 1 MiB \(max_codebase_mb\)"):
        cache.folder(archive)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "big.bin").write_bytes(b"\0" * ((1 << 20) + 1))
    with pytest.raises(ConfigError, match=r"holds over 1 MiB"):
        cache.folder(tmp_path / "big")


def test_a_folder_with_a_pipe_and_a_broken_archive_are_refused(cache, tmp_path):
    (tmp_path / "code").mkdir()
    os.mkfifo(tmp_path / "code" / "pipe")
    with pytest.raises(ConfigError, match="holds 'pipe', which is not a file, folder or link"):
        cache.folder(tmp_path / "code")
    (tmp_path / "broken.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(ConfigError, match="cannot be unpacked"):
        cache.folder(tmp_path / "broken.tar.gz")
