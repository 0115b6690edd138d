"""Unit tests of agentic_rl.tools.sandbox_worker's helpers, imported directly (in this process, no sandbox).

The worker as a whole (setup, namespaces, limits) is tested through `SandboxTool` in test_sandbox.py.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile

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


def test_first_blocked_finds_the_first_directory_a_uid_cannot_traverse():
    base = tempfile.mkdtemp()
    outer = os.path.join(base, "outer")
    inner = os.path.join(outer, "inner")
    os.makedirs(inner)
    os.chmod(base, 0o755)
    os.chmod(outer, 0o700)
    other_uid = 1_900_004_242 if os.geteuid() != 1_900_004_242 else 1_900_004_243
    try:
        if worker.first_blocked(base, other_uid) is not None:
            pytest.skip("the temp dir is not traversable by other users here")
        assert worker.first_blocked(inner, other_uid) == outer
        assert worker.first_blocked(inner, os.stat(outer).st_uid) is None  # the owner may enter
        os.chmod(outer, 0o711)
        assert worker.first_blocked(inner, other_uid) is None
    finally:
        shutil.rmtree(base)


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
