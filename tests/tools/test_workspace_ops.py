"""`agentic_rl.tools.workspace_ops` run directly, in a process of its own with a real file-size limit: an edit that
cannot be written whole leaves the file as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.tools import workspace_ops

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics of Linux")

_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as the sandbox: a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
from agentic_rl.tools import workspace_ops
workspace_ops.main(sys.stdin.read())
"""


def _call(root: Path, op: str, **args: object) -> dict:
    """One call of `op` in a fresh interpreter whose files may not grow past 1 MiB."""
    request = json.dumps({"op": op, "root": str(root), "args": args})
    done = subprocess.run([sys.executable, "-c", _LIMITED], input=request, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.split(workspace_ops.REPLY_MARKER)[1])


def test_an_edit_past_the_file_size_limit_fails_and_leaves_the_file_whole(tmp_path):
    original = "MARK\n" + "b" * 900_000 + "\nEND\n"
    (tmp_path / "f.txt").write_text(original)
    (tmp_path / "f.txt").chmod(0o640)
    for op, args in [("str_replace", {"old_str": "MARK", "new_str": "c" * 300_000}),
                     ("insert", {"insert_line": 1, "new_str": "c" * 300_000}),
                     ("create", {"file_text": "c" * 1_100_000, "overwrite": True})]:  # fmt: skip
        reply = _call(tmp_path, op, path="f.txt", **args)
        assert reply["error"].startswith(f"{op} failed: File too large"), reply
        assert (tmp_path / "f.txt").read_text() == original, op
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640
    # A new file that cannot be written is not left half-written: creating it again is not refused.
    assert "error" in _call(tmp_path, "create", path="g.txt", file_text="c" * 1_100_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    assert _call(tmp_path, "create", path="g.txt", file_text="small\n") == {"ok": "Created g.txt (1 lines)"}
    # An edit that fits keeps the file's permissions.
    assert _call(tmp_path, "str_replace", path="f.txt", old_str="MARK", new_str="MARKED")["ok"].startswith("Edited")
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640


def test_create_refuses_a_path_that_names_a_directory(tmp_path):
    reply = _call(tmp_path, "create", path="newdir/", file_text="x")
    assert reply == {"error": "newdir/ names a directory; give the path of a file to create"}
    assert list(tmp_path.iterdir()) == []
