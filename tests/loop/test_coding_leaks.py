"""Nothing of a coding run outlives it: `agentic-rl rollout --environment workspace` stopped by SIGTERM removes its
workspaces on the way out; killed with SIGKILL it leaves them, and `--resume` removes what the dead run left (and
only that) before it finishes the tasks. Counted from the file system and /proc."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support.leaks import mounts_in, processes_in
from support.processes import cli_command, start, wait_until

pytestmark = pytest.mark.slow


def _root(tmp: Path) -> Path:
    """Where the workspaces of a run started with TMPDIR=tmp live (`WorkspaceConfig.root` None)."""
    return tmp / f"agentic-rl-workspaces-{os.geteuid()}"


def _workspaces(root: Path) -> list[Path]:
    """The workspace folders of every run folder under `root`."""
    return [w for run in root.glob("*") if run.is_dir() for w in run.iterdir() if w.is_dir()] if root.exists() else []


def _rollout(out: Path) -> list[str]:
    return cli_command("rollout", "--model", "tiny-random-smollm2", "--data", "humaneval[:6]", "--environment",
                       "workspace", "--reward", "workspace_tests", "--max-steps", "6", "--max-tokens", "32",
                       "--max-prompt-length", "2048", "--max-response-length", "2048", "--n-parallel", "2",
                       "--reward-timeout-s", "120", "--kv-cache-gib", "0.1", "--output-dir", str(out),
                       "--no-progress")  # fmt: skip


def _started_and_working(tmp_path: Path, name: str):
    tmp, out, log = tmp_path / "tmp", tmp_path / name, tmp_path / f"{name}.log"
    tmp.mkdir(exist_ok=True)
    proc = start(_rollout(out), log, TMPDIR=str(tmp))
    wait_until(proc, lambda: bool(_workspaces(_root(tmp))), what="a workspace", log=log, timeout_s=600)
    return proc, tmp, out, log


def test_a_rollout_stopped_by_sigterm_removes_its_workspaces(tmp_path):
    proc, tmp, _, log = _started_and_working(tmp_path, "stopped")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 130, log.read_text()[-3000:]
    root = _root(tmp)
    assert _workspaces(root) == [] and processes_in(root) == [] and mounts_in(root) == []


def test_resume_removes_what_a_killed_rollout_left_and_only_that(tmp_path):
    proc, tmp, out, log = _started_and_working(tmp_path, "killed")
    root = _root(tmp)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    left = _workspaces(root)
    assert left  # killed on the spot: its folders stay (its sandboxes' processes die with their parent)
    other = root / "not-a-run"  # a folder without an owner marker is not ours: left alone
    other.mkdir()
    resumed = start(cli_command("rollout", "--resume", str(out), "--no-progress"), tmp_path / "resumed.log",
                    TMPDIR=str(tmp))  # fmt: skip
    assert resumed.wait(timeout=900) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert not any(w.exists() for w in left)
    assert _workspaces(root) == [] and processes_in(root) == [] and mounts_in(root) == []
    assert other.is_dir()
    records = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(records) == 6
