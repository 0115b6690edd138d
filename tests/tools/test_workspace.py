"""Tests of agentic_rl.tools.workspace and its tools: real sandbox processes, real overlay mounts or copies, no mocks.

Both ways a workspace gets its files are exercised: an overlay where this machine mounts one (else those tests are
skipped with the reason) and a plain copy (always). Nothing here waits for a fixed time: a command that must time out
sleeps far longer than its limit, and leftovers are polled for until they are gone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.sandbox_processes import start_ticks
from agentic_rl.tools.workspace import OWNER_FILE, Workspaces, owner_marker, sweep_stale_workspaces
from agentic_rl.tools.workspace_config import TestSpec
from agentic_rl.tools.workspace_tools import workspace_tools

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------------- helpers


def _descendants() -> set[int]:
    """Live processes below this test process (zombies too)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _processes_with(argument: str) -> list[int]:
    """Processes whose command line holds `argument` as one of its words."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    words = fh.read().split(b"\0")
            except OSError:
                continue
            if argument.encode() in words:
                found.append(int(entry))
    return found


def _mounts_under(path: str) -> list[str]:
    """Mount points at or below `path` in the mount table of any process (every namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/mountinfo") as fh:
                    found += [line.split()[4] for line in fh if line.split()[4].startswith(path)]
            except OSError:
                continue
    return found


def _wait_until(predicate, timeout_s: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture(scope="module")
def codebase(tmp_path_factory) -> Path:
    """A small Python project with one bug (`add` subtracts) and a test of it."""
    root = tmp_path_factory.mktemp("codebase")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n")
    (root / "notes.txt").write_text("one\ntwo\nthree\n")
    (root / ".hidden").write_text("secret-ish\n")
    (root / "link_inside").symlink_to("notes.txt")
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def _manager(tmp_path_factory, copy_mode: str) -> Workspaces:
    return Workspaces({"root": str(tmp_path_factory.mktemp(f"ws-{copy_mode}")), "copy_mode": copy_mode,
                       "max_output_bytes": 256, "bash_timeout_s": 30})  # fmt: skip


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Iterator[Workspaces]:
    manager = _manager(tmp_path_factory, "copy")
    yield manager
    manager.close()


@pytest.fixture(scope="module")
def overlays(tmp_path_factory) -> Iterator[Workspaces]:
    manager = _manager(tmp_path_factory, "auto")
    if not manager.overlay:
        manager.close()
        pytest.skip(f"no overlay here (isolation {manager.isolation.mode!r}): workspaces are copies")
    yield manager
    manager.close()


@pytest.fixture(params=["copy", "overlay"])
def manager(request) -> Workspaces:
    return request.getfixturevalue("copies" if request.param == "copy" else "overlays")


class Session:
    """One trajectory's workspace with every tool started, as `ToolEnvironment` would drive it."""

    def __init__(self, manager: Workspaces, codebase: Path | None) -> None:
        self.manager, self.id = manager, f"t-{uuid.uuid4().hex[:8]}"
        self.tools = {tool.name: tool for tool in workspace_tools(manager)}
        if codebase is not None:
            manager.register(self.id, str(codebase))
        for tool in self.tools.values():
            tool.session_start(self.id)

    def __call__(self, tool: str, **arguments) -> str:  # type: ignore[no-untyped-def]
        return self.tools[tool].execute_session(self.id, arguments)

    def end(self) -> None:
        for tool in self.tools.values():
            tool.session_end(self.id)
        self.manager.release(self.id, "environment")


@pytest.fixture
def session(manager: Workspaces, codebase: Path) -> Iterator[Session]:
    s = Session(manager, codebase)
    yield s
    s.end()


# --------------------------------------------------------------------------------------------------- privacy


def test_two_workspaces_of_one_code_base_are_private_and_the_code_base_is_unchanged(manager, codebase):
    first, second = Session(manager, codebase), Session(manager, codebase)
    try:
        first("str_replace", path="pkg/calc.py", old_str="return a - b\n\n\ndef", new_str="return a + b\n\n\ndef")
        second("str_replace", path="pkg/calc.py", old_str="return a - b\n\n\ndef", new_str="return b + a\n\n\ndef")
        second("bash", command="rm notes.txt && echo new > made.txt")
        assert "return a + b" in first("view", path="pkg/calc.py")
        assert "return b + a" in second("view", path="pkg/calc.py")
        assert "one" in first("bash", command="cat notes.txt") and "No such file" in first("bash", command="cat made.txt")
        assert first.manager.info(first.id).overlay is (manager.config.copy_mode == "auto")
    finally:
        first.end()
        second.end()
    assert (codebase / "pkg" / "calc.py").read_text().count("return a - b") == 2
    assert (codebase / "notes.txt").read_text() == "one\ntwo\nthree\n" and not (codebase / "made.txt").exists()


def test_an_overlay_mount_lives_only_in_the_sandbox_and_is_gone_after_session_end(overlays, codebase):
    s = Session(overlays, codebase)
    info = overlays.info(s.id)
    s("bash", command="true")  # the interpreter runs
    assert info.path not in [m for m in open("/proc/self/mountinfo").read().split()]  # never in the host's table
    assert _mounts_under(info.path), "the sandbox's own mount table holds the overlay"
    assert os.listdir(info.path) == []  # on the host the mount point stays empty
    s.end()
    assert _wait_until(lambda: not _mounts_under(info.path)), _mounts_under(info.path)
    assert not os.path.exists(os.path.dirname(info.path))


def test_the_workspace_is_what_the_model_works_in_and_the_interpreter_cannot_leave_it(session):
    assert session("bash", command="pwd").splitlines()[0] == session.manager.info(session.id).path
    out = session("bash", command="cat /etc/hostname /work/main/README.md 2>&1 | head -c 300; ls ~ >/dev/null; echo ok")
    if session.manager.isolation.private_root:
        assert "No such file" in out
    assert out.rstrip().endswith("[exit code: 0]")


# --------------------------------------------------------------------------------------------------- bash


def test_bash_keeps_the_working_directory_and_reports_the_exit_code(session):
    assert session("bash", command="cd pkg && export X='a b' && Y=2").endswith("[exit code: 0]")
    out = session("bash", command="pwd; ls; echo \"$X ${Y:-unset}\"; exit 3")
    # The working directory and exported variables are kept (a plain shell variable is not, as between shells).
    assert out.splitlines()[0].endswith("/pkg") and "calc.py" in out and "a b unset" in out
    assert out.endswith("[exit code: 3]")
    assert session("bash", command="cd /nonexistent").endswith("[exit code: 1]")
    assert session("bash", command="pwd").splitlines()[0].endswith("/pkg")
    assert session("bash", command="true") == "(no output)\n[exit code: 0]"
    assert session("bash", command="cd ..; ls -A") == ".hidden\nlink_inside\nnotes.txt\npkg\n[exit code: 0]"  # nothing of the tools
    # The shell's own messages read as under a plain `bash -c`: nothing of the wrapper's files or variables.
    assert session("bash", command="no_such_command_x") == (
        "bash: line 1: no_such_command_x: command not found\n[exit code: 127]"
    )
    assert session("bash", command='echo "$0 $# $1"') == "bash 0 \n[exit code: 0]"


def test_bash_past_its_timeout_kills_the_command_group_but_the_session_survives(session):
    marker = str(900 + uuid.uuid4().int % 99)  # a unique argument of the processes to find
    out = session("bash", command=f"cd pkg; echo started; sleep {marker} & sleep {marker}", timeout_s=1)
    assert out.startswith("started\n") and "timed out after 1 s" in out and "working directory and variables are unchanged" in out
    assert _wait_until(lambda: not _processes_with(marker)), _processes_with(marker)
    after = session("bash", command="pwd; echo alive")
    assert not after.splitlines()[0].endswith("/pkg") and "alive" in after  # the timed-out `cd` did not hold
    session("bash", command="export Z=kept")
    session("bash", command="export Z=lost; sleep 5", timeout_s=1)
    assert session("bash", command="echo $Z").startswith("kept\n")  # nor did its export


def test_bash_output_is_cut_between_whole_characters_keeping_head_and_tail(session):
    out = session("bash", command="printf 'x'; for i in $(seq 1000); do printf 'é'; done; printf 'END\\n'")
    cut = re.fullmatch(r"(xé+)\n\[\.\.\. (\d+) bytes of output left out \(limit 256 bytes\) \.\.\.\]\n(é+END\n)"
                       r"\[exit code: 0\]", out)  # fmt: skip
    assert cut is not None, out
    head, left_out, tail = cut[1].encode(), int(cut[2]), cut[3].encode()
    assert len(head) <= 128 and len(tail) <= 128 and len(head) + left_out + len(tail) == 1 + 2000 + 4


def test_bash_arguments_are_checked(session):
    with pytest.raises(ToolError, match="'command' argument is required"):
        session("bash")
    with pytest.raises(ToolError, match="timeout_s must be a number of seconds above 0 and at most 300"):
        session("bash", command="true", timeout_s=10_000)
    # A misnamed argument is named beside what is missing; extra arguments of a complete call are ignored.
    with pytest.raises(ToolError) as info:
        session("insert", path="pkg/calc.py", line=1, text="# top")
    assert str(info.value) == (
        "the 'insert_line' argument is required and must be an integer, got None; unknown argument(s) 'line', "
        "'text': insert takes path, insert_line, new_str"
    )
    # An argument the schema does not have is refused rather than dropped; null is an optional one left out.
    with pytest.raises(ToolError, match=r"^unknown argument\(s\) 'cwd': bash takes command, timeout_s$"):
        session("bash", command="echo ok", cwd="pkg")
    assert session("bash", command="echo ok", timeout_s=None) == "ok\n[exit code: 0]"
    assert session("create", path="n.txt", file_text="x\n", overwrite=None) == "Created n.txt (1 lines)"
    assert session("view", path="n.txt", view_range=None) == "     1\tx"


# --------------------------------------------------------------------------------------------------- file tools


def test_view_numbers_lines_and_ranges_and_lists_directories(session):
    assert session("view", path="notes.txt") == "     1\tone\n     2\ttwo\n     3\tthree"
    assert session("view", path="notes.txt", view_range=[2, -1]) == "     2\ttwo\n     3\tthree"
    listing = session("view", path=".")
    assert "pkg/calc.py" in listing and "notes.txt" in listing and ".hidden" not in listing
    with pytest.raises(ToolError) as error:
        session("view", path="notes.txt", view_range=[2, 9])
    assert str(error.value) == ("view_range [2, 9] is out of bounds: notes.txt has 3 lines; give [start, end] with "
                                "1 <= start <= end <= 3, or end -1 for the last line")  # fmt: skip
    with pytest.raises(ToolError, match="missing.py does not exist; view '.' to list the workspace"):
        session("view", path="missing.py")


def test_paths_that_leave_the_workspace_are_refused(session):
    root = session.manager.info(session.id).path
    with pytest.raises(ToolError, match=r"'\.\./\.\./etc/passwd' is outside the workspace: give a path relative"):
        session("view", path="../../etc/passwd")
    with pytest.raises(ToolError, match="'/etc/passwd' is outside the workspace"):
        session("create", path="/etc/passwd", file_text="x")
    assert "three" in session("view", path=f"{root}/notes.txt")  # absolute, inside
    assert "three" in session("view", path="link_inside")  # a link that stays inside
    session("bash", command="ln -s /etc out && ln -s /etc/hostname leak")
    for path in ("leak", "out/passwd"):
        with pytest.raises(ToolError, match="leads outside the workspace through a symbolic link"):
            session("view", path=path)
    with pytest.raises(ToolError, match="through a symbolic link"):
        session("create", path="out/new.txt", file_text="x")


def test_create_makes_parents_and_refuses_an_existing_file_unless_overwrite(session):
    assert session("create", path="deep/er/new.py", file_text="a = 1\nb = 2\n") == "Created deep/er/new.py (2 lines)"
    assert session("bash", command="cat deep/er/new.py") == "a = 1\nb = 2\n[exit code: 0]"
    with pytest.raises(ToolError) as error:
        session("create", path="deep/er/new.py", file_text="c = 3\n")
    assert "already exists; change it with str_replace or insert, or call create with \"overwrite\": true" in str(error.value)
    assert session("create", path="deep/er/new.py", file_text="c = 3\n", overwrite=True).startswith("Overwrote")
    with pytest.raises(ToolError, match="pkg/ names a directory"):
        session("create", path="pkg", file_text="")


def test_str_replace_needs_exactly_one_occurrence_and_says_where_the_others_are(session):
    with pytest.raises(ToolError) as none:
        session("str_replace", path="pkg/calc.py", old_str="return a * b")
    assert "old_str does not occur in pkg/calc.py" in str(none.value) and "whitespace" in str(none.value)
    with pytest.raises(ToolError) as two:
        session("str_replace", path="pkg/calc.py", old_str="return a - b", new_str="return 0")
    assert "occurs 2 times in pkg/calc.py (starting on lines 2, 6)" in str(two.value)
    assert "exactly once" in str(two.value)
    out = session("str_replace", path="pkg/calc.py", old_str="def sub(a, b):\n    return a - b", new_str="def sub(a, b):\n    return a - b - 0")
    assert out.startswith("Edited pkg/calc.py: lines 5-6 now read") and "     6\t    return a - b - 0" in out
    with pytest.raises(ToolError, match="'old_str' argument must not be empty"):
        session("str_replace", path="pkg/calc.py", old_str="")


def test_insert_adds_lines_after_the_given_line(session):
    out = session("insert", path="notes.txt", insert_line=0, new_str="zero")
    assert "     1\tzero\n     2\tone" in out
    session("insert", path="notes.txt", insert_line=4, new_str="four\nfive\n")
    assert session("bash", command="cat notes.txt") == "zero\none\ntwo\nthree\nfour\nfive\n[exit code: 0]"
    with pytest.raises(ToolError) as error:
        session("insert", path="notes.txt", insert_line=9, new_str="x")
    assert "insert_line 9 is out of bounds: notes.txt has 6 lines; give 0 to insert at the top, or 1 to 6" in str(error.value)
    session("create", path="feed.txt", file_text="a\fb\nc")  # a form feed ends no line; a last line without "\n"
    session("insert", path="feed.txt", insert_line=1, new_str="x")
    session("insert", path="feed.txt", insert_line=3, new_str="end")
    assert session("view", path="feed.txt") == "     1\ta\fb\n     2\tx\n     3\tc\n     4\tend"


# --------------------------------------------------------------------------------------------------- tests as reward


def test_a_test_run_in_a_fresh_interpreter_sees_the_edits_and_the_hidden_files(session):
    session("bash", command="sleep 944 > /dev/null 2>&1 &")  # a process of the model's: gone before the tests
    session("str_replace", path="pkg/calc.py", old_str="def add(a, b):\n    return a - b", new_str="def add(a, b):\n    return a + b")
    hidden = {"tests/test_hidden.py": "from pkg.calc import add, sub\n\ndef test_add():\n    assert add(2, 3) == 5\n\n"
                                      "def test_sub():\n    assert sub(2, 3) == 5\n"}  # fmt: skip
    assert "No such file" in session("bash", command="ls tests")  # hidden during the episode
    spec = TestSpec("python -m pytest -q tests", hidden, ("tests/test_hidden.py::test_add",), 120.0)
    run = session.manager.run_tests(session.id, spec)
    assert (run.returncode, run.report, run.total, run.passed, run.listed_passed) == (1, True, 2, 1, 1)
    assert not _processes_with("944")
    failing = TestSpec("python -m pytest -q tests", hidden, ("tests/test_hidden.py::test_sub", "tests/test_x.py::test_gone"), 120.0)
    run = session.manager.run_tests(session.id, failing)
    assert run.listed_passed == 0 and run.not_passed == {"tests/test_hidden.py::test_sub": "failed",
                                                         "tests/test_x.py::test_gone": "missing"}  # fmt: skip
    # The hidden files were there for the runs only: the folder they made is gone again, and so is the shell state.
    assert "No such file" in session("bash", command="ls tests")


def test_hidden_test_files_replace_the_workspace_s_own_for_the_run_only(session):
    session("bash", command="mkdir -p pkg/deep && echo 'mine = 1' > pkg/own.py && cd pkg && export KEPT=1")
    hidden = {"pkg/own.py": "assert False, 'the hidden version ran'\n", "pkg/deep/new/test_x.py": "x = 1\n"}
    run = session.manager.run_tests(session.id, TestSpec("python pkg/own.py && cat pkg/deep/new/test_x.py", hidden, (), 60.0))
    assert run.returncode == 1 and "the hidden version ran" in run.tail
    out = session("bash", command="pwd; echo ${KEPT:-forgotten}; cat pkg/own.py; find pkg/deep")
    assert out.splitlines()[1:] == ["forgotten", "mine = 1", "pkg/deep", "[exit code: 0]"], out


def test_a_test_run_past_its_time_limit_is_reported_as_timed_out(session):
    run = session.manager.run_tests(session.id, TestSpec("echo begun; sleep 977", {}, (), 1.0))
    assert run.returncode is None and "begun" in run.tail
    assert _wait_until(lambda: not _processes_with("977"))


# --------------------------------------------------------------------------------------------------- cleanup


def test_session_end_leaves_no_process_mount_or_folder(manager, codebase):
    before = _descendants()
    s = Session(manager, codebase)
    s("bash", command="(sleep 955 &) ; sleep 956 > /dev/null 2>&1 & echo ok")
    info = manager.info(s.id)
    assert set(info.pids) <= _descendants() and _wait_until(lambda: _processes_with("955") and _processes_with("956"))
    s.end()
    assert manager.info(s.id) is None
    assert _wait_until(lambda: not (_descendants() - before)), _descendants() - before
    assert not _processes_with("956")
    if manager.isolation.pid_namespace:  # elsewhere a process that left the group is the host init's
        assert not _processes_with("955")
    assert not _mounts_under(os.path.dirname(info.path)) and not os.path.exists(os.path.dirname(info.path))


def test_the_workspace_lives_until_its_last_holder_lets_it_go(copies, codebase):
    s = Session(copies, codebase)
    for name, tool in s.tools.items():
        tool.session_end(s.id)
        assert copies.info(s.id) is not None, name  # the environment still holds it
    copies.release(s.id, "environment")
    assert copies.info(s.id) is None
    with pytest.raises(ToolError, match="has no workspace"):
        copies.call(s.id, "view", {"path": "."}, timeout_s=10)


def test_close_removes_every_workspace_and_the_run_folder(tmp_path, codebase):
    manager = Workspaces({"root": str(tmp_path), "copy_mode": "copy"})
    sessions = [Session(manager, codebase) for _ in range(2)]
    folders = [os.path.dirname(manager.info(s.id).path) for s in sessions]
    manager.close()
    assert not any(os.path.exists(f) for f in folders) and not os.path.exists(manager.run_root)
    with pytest.raises(ToolError, match="closed"):
        manager.register("late", None)


def test_register_refuses_what_cannot_be_a_code_base(copies, tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        copies.register("x1", str(tmp_path / "missing"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match="neither a folder nor an archive"):
        copies.register("x2", str(tmp_path / "file.txt"))


# --------------------------------------------------------------------------------------------------- stale folders


def _dead_owner() -> dict[str, int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert _wait_until(lambda: start_ticks(proc.pid) is not None)
        return owner_marker(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_sweep_removes_only_what_dead_owners_left(tmp_path):
    def run_folder(name: str, owner: dict | None) -> Path:  # type: ignore[type-arg]
        folder = tmp_path / name
        (folder / "ws-1" / "work").mkdir(parents=True)
        if owner is not None:
            (folder / OWNER_FILE).write_text(json.dumps(owner))
        return folder

    me = owner_marker()
    dead = run_folder("dead", _dead_owner())
    reused = run_folder("reused", {**me, "start_ticks": me["start_ticks"] - 1})  # this pid, an earlier process
    rebooted = run_folder("rebooted", {**me, "boot_id": "an-earlier-boot"})
    live = run_folder("live", me)
    elsewhere = run_folder("elsewhere", {**me, "pid_namespace": me["pid_namespace"] + 1})  # cannot be told
    unmarked = run_folder("unmarked", None)
    assert sorted(sweep_stale_workspaces(tmp_path)) == sorted(map(str, [dead, reused, rebooted]))
    assert live.exists() and elsewhere.exists() and unmarked.exists()
    assert not dead.exists() and not reused.exists() and not rebooted.exists()


def test_a_killed_owner_leaves_no_process_or_mount_and_its_folder_is_swept(tmp_path, codebase):
    script = textwrap.dedent(f"""
        import sys, time
        from agentic_rl.tools.workspace import Workspaces
        manager = Workspaces({{"root": {str(tmp_path)!r}}})
        manager.register("s", {str(codebase)!r})
        manager.acquire("s", "bash")
        manager.call("s", "bash", {{"command": "sleep 933 > /dev/null 2>&1 &", "timeout_s": 10, "max_output_bytes": 256}}, timeout_s=60)
        print(manager.info("s").path, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    path = proc.stdout.readline().strip()
    assert path and _wait_until(lambda: _processes_with("933")) and os.path.isdir(path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert _wait_until(lambda: not _processes_with("933") and not _mounts_under(path))
    run_folder = os.path.dirname(os.path.dirname(path))
    assert sweep_stale_workspaces(tmp_path) == [run_folder] and not os.path.exists(run_folder)
