"""Unit tests of agentic_rl.tools.sandbox_worker's helpers, imported directly (in this process, no sandbox).

The worker as a whole (setup, namespaces, limits) is tested through `SandboxTool` in test_sandbox.py.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from agentic_rl.tools import sandbox_worker as worker


@pytest.fixture
def pipe():
    """A pipe's (read end, write end); writes must stay below its buffer (64 KiB) as nothing reads concurrently."""
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def test_importing_the_worker_runs_nothing_and_imports_no_agentic_rl_code():
    source = worker.__file__
    tree = ast.parse(open(source).read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and not any(name.split(".")[0] == "agentic_rl" for name in imported)
    assert all(name.split(".")[0] in sys.stdlib_module_names | {"__future__"} for name in imported), imported
    # In a fresh isolated interpreter, importing the file as a module neither reads argv nor touches stdin/stdout.
    code = f"import importlib.util as u; s = u.spec_from_file_location('w', {source!r})"
    code += "; s.loader.exec_module(u.module_from_spec(s)); print('imported')"
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "imported\n" and done.stderr == ""


def test_frames_round_trip_through_a_file(tmp_path):
    fd = os.open(tmp_path / "frames", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        messages = [{"code": "print('héllo ✓')"}, {"output": "x" * 200_000, "dropped": 3}, [1, None, "\U0001f600"]]
        for message in messages:
            worker.write_frame(fd, message)
        os.lseek(fd, 0, os.SEEK_SET)
        assert [worker.read_frame(fd) for _ in messages] == messages
        assert worker.read_frame(fd) is None  # end of file
    finally:
        os.close(fd)


def test_frame_layout_is_a_big_endian_length_then_utf8_json(pipe):
    read_fd, write_fd = pipe
    worker.write_frame(write_fd, {"a": "é"})
    os.close(write_fd)
    data = os.read(read_fd, 1024)
    body = json.dumps({"a": "é"}, ensure_ascii=False).encode()
    assert data == len(body).to_bytes(4, "big") + body
    assert worker.HEADER.size == 4


def test_lone_surrogates_travel_as_json_escapes_in_valid_utf8(pipe):
    read_fd, write_fd = pipe
    worker.write_frame(write_fd, {"output": "a\udcffb"})
    os.close(write_fd)
    data = os.read(read_fd, 1024)
    assert data[4:].decode("utf-8") == '{"output": "a\\udcffb"}'  # strict UTF-8 on the wire
    assert json.loads(data[4:]) == {"output": "a\udcffb"}


def test_a_truncated_frame_reads_as_end_of_file(pipe):
    read_fd, write_fd = pipe
    os.write(write_fd, (10).to_bytes(4, "big") + b'{"a"')
    os.close(write_fd)
    assert worker.read_frame(read_fd) is None
    assert worker.read_exact(read_fd, 1) is None


def test_read_exact_collects_partial_reads(pipe):
    read_fd, write_fd = pipe
    os.write(write_fd, b"abc")
    os.write(write_fd, b"def")
    assert worker.read_exact(read_fd, 5) == b"abcde"


@pytest.mark.parametrize("text", ["", "ascii", "héllo", "✓" * 70_000, "\U0001f600x", "a\udcffb"])
def test_utf8_len_counts_bytes_as_written(text):
    assert worker.utf8_len(text) == len(text.encode("utf-8", "backslashreplace"))


@pytest.mark.parametrize(
    ("path", "top", "expected"),
    [
        ("/tmp", "/tmp", True),
        ("/tmp/a/b", "/tmp", True),
        ("/tmp/a", "/tmp/", True),
        ("/tmpfoo", "/tmp", False),
        ("/", "/tmp", False),
        ("/anything", "/", True),
    ],
)
def test_under(path, top, expected):
    assert worker.under(path, top) is expected


def test_root_binds_hold_the_system_and_the_interpreter_but_not_other_sys_path_entries(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])  # e.g. a checkout added by an editable install
    binds = worker.root_binds()
    insides = [inside for inside, _ in binds]
    assert insides == sorted(insides) and len(set(insides)) == len(insides)
    assert not any(a != b and worker.under(a, b) for a in insides for b in insides)  # none inside another
    assert all(os.path.exists(real) and real == os.path.realpath(real) for _, real in binds)
    for needed in (os.path.realpath(sys.executable), os.path.realpath(os.path.dirname(os.__file__)), "/dev/null"):
        assert any(worker.under(needed, inside) for inside in insides), needed
    assert not any(worker.under(str(tmp_path), inside) for inside in insides)
    assert not any(inside == "/" or inside in ("/etc", "/home", "/root", "/dev", "/tmp") for inside in insides)


@pytest.mark.parametrize(
    ("data", "limit", "expected"),
    [
        (b"abc", 5, 3),
        (b"abc", 2, 2),
        ("aé".encode(), 2, 1),  # would split é (2 bytes)
        ("aé".encode(), 3, 3),
        ("€x".encode(), 1, 0),
        ("€x".encode(), 2, 0),
        ("€x".encode(), 3, 3),
        ("𝄞".encode(), 3, 0),  # 4-byte character
        (b"\x80\x80\x80\x80\x80", 4, 1),  # not UTF-8: at most 3 bytes back
        (b"abc", 0, 0),
    ],
)
def test_utf8_boundary_never_splits_a_character(data, limit, expected):
    assert worker.utf8_boundary(data, limit) == expected


@pytest.mark.parametrize(
    ("data", "cap", "expected"),
    [
        (b"hello", 10, ("hello", 5)),
        ("ab€".encode(), 4, ("ab", 2)),
        ("ab€".encode(), 5, ("ab€", 5)),
        (b"\xff" * 10, 9, ("\ufffd" * 3, 3)),  # U+FFFD takes 3 bytes for each invalid byte
        (b"ok\xffok", 6, ("ok\ufffdo", 4)),
    ],
)
def test_shown_output_fits_the_cap_in_utf8_and_counts_the_raw_bytes_shown(data, cap, expected):
    text, shown = worker.shown_output(data, cap)
    assert (text, shown) == expected and len(text.encode()) <= cap


def test_interpreter_dirs_hold_the_interpreter_and_the_standard_library():
    found = worker.interpreter_dirs()
    assert os.path.dirname(os.path.realpath(sys.executable)) in found
    assert any(worker.under(os.path.realpath(os.path.dirname(os.__file__)), d) for d in found)
    assert all(os.path.isdir(d) and d == os.path.realpath(d) for d in found)


def test_capture_writes_up_to_its_cap_and_counts_the_rest(tmp_path):
    fd = os.open(tmp_path / "capture", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        stream = worker.Capture(fd, 10)
        assert stream.write("héllo") == 5  # 6 bytes
        assert stream.write("wörld!") == 6  # 7 bytes: 4 fit
        assert stream.write("more") == 4
        assert os.pread(fd, 100, 0) == "héllowör".encode()[:10]
        assert stream.dropped == 6 + 7 + 4 - 10
        stream.reset()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        assert stream.write("abcdefgh€") == 9  # the euro sign's 3 bytes straddle the cap of 10
        assert stream.write("!") == 1  # fits in the room left, but nothing is appended after a cut
        assert os.pread(fd, 100, 0) == b"abcdefgh" and stream.dropped == 3 + 1 and stream.full
        with pytest.raises(TypeError, match="must be str"):
            stream.write(b"bytes")  # type: ignore[arg-type]
        stream.reset()
        assert stream.dropped == 0 and not stream.full
        assert stream.fileno() == fd and stream.writable() and not stream.isatty()
    finally:
        os.close(fd)


def test_run_cell_prints_the_last_expression_and_keeps_state(tmp_path):
    fd = os.open(tmp_path / "capture", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        stream = worker.Capture(fd, 1 << 16)
        scope = {"__name__": "__main__"}
        worker.run_cell("x = 40\nx + 2", "<cell 1>", scope, stream)
        worker.run_cell("def f():\n    return 1 / 0\nf()", "<cell 2>", scope, stream)
        worker.run_cell("def broken(:", "<cell 3>", scope, stream)
        output = os.pread(fd, 1 << 16, 0).decode()
    finally:
        os.close(fd)
    assert output.startswith("42\nTraceback (most recent call last):\n")
    assert scope["_"] == 42 and scope["x"] == 40
    assert 'File "<cell 2>", line 3' in output and "return 1 / 0" in output and "ZeroDivisionError" in output
    assert "SyntaxError" in output
    assert worker.__file__ not in output and "run_cell" not in output  # the worker's own frames are cut


def test_drop_capabilities_leaves_no_capability_in_any_set():
    """What mode "userns" relies on: uid 0 of its user namespace can no longer mount (undo the read-only root)."""
    if os.geteuid() != 0:
        pytest.skip("dropping the bounding set needs CAP_SETPCAP (root, or uid 0 of a user namespace)")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops its capabilities and reports its capability sets
        try:
            worker.drop_capabilities()
            with open("/proc/self/status") as fh:
                caps = [line.split()[1] for line in fh if line.startswith("Cap")]
            os.write(write_fd, json.dumps(caps).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    caps = json.loads(os.read(read_fd, 4096) or b"null")
    os.close(read_fd)
    os.waitpid(pid, 0)
    assert caps == ["0000000000000000"] * 5  # inheritable, permitted, effective, bounding, ambient
