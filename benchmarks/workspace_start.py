"""What a coding workspace costs to start: a plain subprocess, a Python sandbox session, and a workspace of a code
base as a copy and as an overlay, each until its first command has answered; and the test run of a small project.

    .venv/bin/python benchmarks/workspace_start.py [--files 2000] [--repeats 5] [--quick]

The code base is synthetic: `--files` Python files of 4 KiB in 40 folders. Times are medians over `--repeats`
starts, in seconds, on whatever else the machine is doing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import save, table, verdict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentic_rl.tools.sandbox import SandboxTool  # noqa: E402
from agentic_rl.tools.workspace import Workspaces  # noqa: E402
from agentic_rl.tools.workspace_config import TestSpec  # noqa: E402


def make_codebase(root: Path, files: int) -> Path:
    for i in range(files):
        path = root / f"pkg{i % 40}" / f"m{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"X{i} = 1\n" + "# padding\n" * 400)
    (root / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    return root


def _median(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _workspace(manager: Workspaces, codebase: Path) -> None:
    """One workspace of `codebase` started, its first command run, removed."""
    session = "b"
    manager.register(session, str(codebase))
    manager.acquire(session, "bash")
    manager.call(session, "bash", {"command": "true", "timeout_s": 10, "max_output_bytes": 256}, timeout_s=60)
    manager.release(session, "bash")
    manager.release(session, "environment")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    files, repeats = (200, 3) if args.quick else (args.files, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        codebase = make_codebase(Path(tmp) / "code", files)
        rows = [("python -c pass", _median(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeats))]
        sandbox = SandboxTool()
        sandbox.isolation  # noqa: B018 - probed once, outside the timings

        def sandbox_session() -> None:
            sandbox.session_start("s")
            sandbox.execute_session("s", {"code": "pass"})
            sandbox.session_end("s")

        rows.append(("sandbox session", _median(sandbox_session, repeats)))
        runs = {}
        for mode in ("copy", "auto"):
            manager = Workspaces({"root": str(Path(tmp) / mode), "copy_mode": mode})
            name = f"workspace ({'overlay' if manager.overlay else 'copy'})"
            rows.append((name, _median(lambda m=manager: _workspace(m, codebase), repeats)))
            manager.register("t", str(codebase))
            runs[name] = manager.run_tests("t", TestSpec("python -m pytest -q test_ok.py", {}, (), 120.0)).seconds
            manager.close()
        sandbox.close()
    print(f"{files} files of 4 KiB, median of {repeats}:")
    print(table(["start, until the first command answered", "seconds"], rows))
    print(table(["test run (fresh interpreter, pytest, 1 test)", "seconds"], list(runs.items())))
    result = {"files": files, "repeats": repeats, "start_s": dict(rows), "test_run_s": runs}
    save("workspace_start", result, args.out, args.quick, verdict(note="start times of workspaces, reported"))


if __name__ == "__main__":
    main()
