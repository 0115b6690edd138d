"""Tests of what the Python sandbox sees of the host's files, and of how it cuts long output: real sandbox processes.

The file-system tests plant a world-readable file outside ``/tmp`` (in this checkout) and run where the chosen
isolation mode gives the sandbox its own minimal root (`SandboxIsolation.private_root`); elsewhere they are skipped
with the reason, and the warning that says the host's files are visible is tested instead.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentic_rl.tools import sandbox_isolation
from agentic_rl.tools.sandbox import SandboxTool
from agentic_rl.tools.sandbox_isolation import isolation_mode

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[tuple[SandboxTool, str]]:
    """One tool and one live session (named ``"files"``) shared by the tests of this module."""
    tool = SandboxTool(timeout_s=30.0)
    try:
        tool.session_start("files")
        yield tool, "files"
    finally:
        tool.close()


@pytest.fixture
def planted() -> Iterator[Path]:
    """A world-readable file with a secret in this checkout (outside /tmp when the checkout is)."""
    path = REPO / f"planted-{uuid.uuid4().hex}.txt"
    path.write_text("planted secret\n")
    path.chmod(0o644)
    yield path
    path.unlink()


def run(tool: SandboxTool, session_id: str, code: str) -> str:
    return tool.execute_session(session_id, {"code": code})


def _needs_private_root(sandbox: tuple[SandboxTool, str]) -> tuple[SandboxTool, str]:
    tool = sandbox[0]
    if not tool.isolation.private_root:
        pytest.skip(f"isolation mode {tool.isolation.mode!r} does not hide the host's files on this machine")
    return sandbox


# ------------------------------------------------------------------------------------------------ host files


def test_a_planted_world_readable_file_outside_tmp_cannot_be_read_or_listed(sandbox, planted):
    tool, session = _needs_private_root(sandbox)
    assert planted.read_text() == "planted secret\n"  # the host can read it
    observation = run(tool, session, f"print(open({str(planted)!r}).read())")
    assert "planted secret" not in observation and "FileNotFoundError" in observation, observation
    for directory in {str(planted.parent), str(planted.parent.parent), os.path.expanduser("~")}:
        listing = run(tool, session, f"import os\ntry:\n    print(os.listdir({directory!r}))\nexcept OSError as e:\n"
                                     "    print(type(e).__name__)")  # fmt: skip
        assert planted.name not in listing and "pyproject.toml" not in listing, listing


def test_the_checkout_and_its_git_config_are_not_visible(sandbox):
    tool, session = _needs_private_root(sandbox)
    git = REPO / ".git"
    assert git.exists()
    for path in (git, REPO / "pyproject.toml", REPO / "agentic_rl" / "__init__.py"):
        assert run(tool, session, f"import os\nprint(os.path.exists({str(path)!r}))") == "False\n", path
    config = os.path.join(os.path.realpath(git) if git.is_dir() else str(git), "config")
    assert "FileNotFoundError" in run(tool, session, f"open({config!r}).read()")
    assert "ModuleNotFoundError" in run(tool, session, "import agentic_rl")  # an editable install points outside


def test_the_root_is_read_only_and_minimal(sandbox):
    tool, session = _needs_private_root(sandbox)
    top = run(tool, session, "import os\nprint(sorted(os.listdir('/')))")
    assert "'usr'" in top and "'tmp'" in top and "'home'" not in top and "'srv'" not in top, top
    etc = run(tool, session, "import os\nprint(sorted(os.listdir('/etc')))")
    assert "'ld.so.cache'" in etc and "'passwd'" in etc and "'shadow'" not in etc and "'hostname'" not in etc, etc
    for path in ("/usr/evil", "/evil", "/etc/evil"):
        observation = run(tool, session, f"open({path!r}, 'w').write('x')")
        assert "Read-only file system" in observation or "PermissionError" in observation, observation


def test_normal_python_still_works_in_the_private_root(sandbox):
    tool, session = _needs_private_root(sandbox)
    code = "import json, fractions, sqlite3, decimal, os, subprocess, sys\n"
    code += "open('out.txt', 'w').write('kept')\nprint(open('out.txt').read(), os.listdir('.'))\n"
    code += "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout)"
    assert run(tool, session, code) == "kept ['out.txt']\n42\n\n"
    assert run(tool, session, "import getpass\nprint(getpass.getuser())") == "sandbox\n"
    code = "import multiprocessing as mp\nwith mp.get_context('spawn').Pool(2) as pool:\n"
    code += "    print(pool.map(abs, [-1, -2]))"
    assert run(tool, session, code) == "[1, 2]\n"
    code = "def double(x):\n    return 2 * x\nimport multiprocessing as mp\n"
    code += "with mp.get_context('fork').Pool(2) as pool:\n    print(pool.map(double, [1, 2]))"
    assert run(tool, session, code) == "[2, 4]\n"  # functions of a cell pickle as __main__'s
    if importlib.util.find_spec("numpy") is not None:
        assert run(tool, session, "import numpy as np\nprint(int(np.arange(5).sum()))") == "10\n"


def test_an_interpreter_below_tmp_is_bound_into_the_private_root(sandbox, tmp_path, monkeypatch):
    tool, _ = _needs_private_root(sandbox)
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (tmp_path / "beside.txt").write_text("host file beside the interpreter\n")
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    other = SandboxTool(timeout_s=30.0, isolation=tool.isolation.mode)
    other.session_start("venv")
    try:
        code = f"import os, sys\nprint(sys.prefix == {str(venv)!r}, sorted(os.listdir({str(tmp_path)!r})))"
        assert run(other, "venv", code) == "True ['venv']\n"  # the private /tmp holds the interpreter, not the rest
    finally:
        other.close()


def test_a_mode_without_a_private_root_says_so_in_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(sandbox_isolation, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="agentic_rl.tools.sandbox"):
        sandbox_isolation._warn_missing(isolation_mode("uid", None), [])
    assert any(
        "file system is NOT hidden" in r.getMessage() and ".git/config" in r.getMessage() for r in caplog.records
    )
    assert isolation_mode("namespaces", "unshare").isolation.private_root
    assert isolation_mode("userns", "unshare").isolation.private_root


# ------------------------------------------------------------------------------------------------ output cap


@pytest.mark.parametrize(
    ("code", "shown", "dropped"),
    [
        ("print('é' * 10)", "é" * 5, 11),  # 21 bytes: 5 characters (10 bytes) fit in 11
        ("print('abcdefghij€€')", "abcdefghij", 7),  # the euro sign's 3 bytes straddle the cap
        ("print('𝄞' * 3)", "𝄞" * 2, 5),  # 4-byte characters
        ("import os\nos.write(1, '€'.encode() * 5)\nNone", "€" * 3, 6),  # raw writes bypass sys.stdout
        ("import os\nos.write(1, b'\\xff' * 20)\nNone", "\ufffd" * 3, 17),  # not UTF-8: U+FFFD, 3 bytes each
    ],
)
def test_output_is_cut_between_characters_and_the_marker_counts_the_bytes_left_out(code, shown, dropped):
    sandbox = SandboxTool(timeout_s=30.0, max_output_bytes=11)
    sandbox.session_start("cap")
    try:
        observation = run(sandbox, "cap", code)
    finally:
        sandbox.close()
    assert observation == f"{shown}\n[output truncated: {dropped} more bytes not shown (limit 11 bytes)]"
