"""Tests of agentic_rl.tools.sandbox: real sandbox processes, no mocks.

Guarantees that depend on the machine (network namespace, private /tmp, unprivileged uid, per-session process
limit) are tested when `SandboxTool.isolation` says they are given, and skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest

from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools import sandbox as sandbox_module
from agentic_rl.tools.base import StatefulTool
from agentic_rl.tools.sandbox import SANDBOX_UID_BASE, SANDBOX_UID_COUNT, SandboxTool

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

ALLOWED_ENV = {"PATH", "HOME", "LANG", "PYTHONHASHSEED", "TMPDIR", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
ALLOWED_ENV |= {"MKL_NUM_THREADS"}


# --------------------------------------------------------------------------------------------------- /proc helpers


def _processes() -> dict[int, tuple[int, set[int], str]]:
    """pid -> (parent pid, uids, state) of every process, zombies included."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        uids = {int(u) for u in fields["Uid"].split()}
        table[int(entry)] = (int(fields["PPid"]), uids, fields["State"].strip()[:1])
    return table


def _sandbox_processes() -> set[int]:
    """Descendants of this test process, plus every process (zombies too) running as a sandbox uid."""
    table = _processes()
    found = {pid for pid, (_, uids, _) in table.items() if any(_is_sandbox_uid(u) for u in uids)}
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        found.update(children)
        todo.extend(children)
    return found


def _is_sandbox_uid(uid: int) -> bool:
    return SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_COUNT


def _uid_processes(uid: int) -> set[int]:
    return {pid for pid, (_, uids, _) in _processes().items() if uid in uids}


def _wait_until(predicate, timeout_s: float = 60.0) -> bool:  # returns as soon as it holds; long for loaded CI  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _gone(pids) -> bool:  # type: ignore[no-untyped-def]
    """True when none of `pids` exists any more, not even as a zombie."""
    return not set(pids) & set(_processes())


# --------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def processes_before() -> Iterator[set[int]]:
    """Checks, after every test of this module, that no sandbox process is left (zombies included)."""
    before = _sandbox_processes()
    yield before
    assert _wait_until(lambda: not _sandbox_processes() - before), _sandbox_processes() - before


@pytest.fixture(scope="module")
def tool(processes_before: set[int]) -> Iterator[SandboxTool]:
    sandbox = SandboxTool(timeout_s=5.0)
    sandbox.isolation  # noqa: B018 - probe once, outside the timed tests
    yield sandbox
    sandbox.close()


@pytest.fixture
def session(tool: SandboxTool) -> Iterator[str]:
    session_id = f"test-{uuid.uuid4().hex[:8]}"
    tool.session_start(session_id)
    yield session_id
    tool.session_end(session_id)


def run(tool: SandboxTool, session_id: str, code: str) -> str:
    return tool.execute_session(session_id, {"code": code})


# --------------------------------------------------------------------------------------------------- contract


def test_sandbox_is_a_stateful_tool_named_python_with_a_required_code_string():
    sandbox = SandboxTool()
    assert isinstance(sandbox, StatefulTool)
    function = sandbox.schema["function"]
    assert function["name"] == "python"
    assert function["parameters"]["required"] == ["code"]
    assert function["parameters"]["properties"]["code"]["type"] == "string"
    json.dumps(sandbox.schema)
    assert sandbox.call_timeout_s > sandbox.timeout_s  # the environment's limit leaves room to kill and restart
    assert SandboxTool(timeout_s=7).timeout_s == 7.0  # the code's limit reads as given
    with pytest.raises(TypeError, match="stateful"):
        sandbox.execute({"code": "1"})


@pytest.mark.parametrize(
    "kwargs",
    [{"timeout_s": 0}, {"max_output_bytes": -1}, {"memory_limit_mb": 0}, {"max_processes": True}, {"isolation": "x"}],
)
def test_sandbox_rejects_invalid_limits(kwargs):
    with pytest.raises(ConfigError):
        SandboxTool(**kwargs)


def test_invalid_arguments_and_unknown_sessions_raise_tool_error(tool, session):
    with pytest.raises(ToolError, match="'code'"):
        tool.execute_session(session, {})
    with pytest.raises(ToolError, match="'code'"):
        tool.execute_session(session, {"code": 42})
    with pytest.raises(ToolError, match="longer than"):
        tool.execute_session(session, {"code": "#" * (tool.max_code_bytes + 1)})
    with pytest.raises(ToolError, match="unknown session"):
        tool.execute_session("no-such-session", {"code": "1"})
    tool.session_end("no-such-session")  # idempotent on unknown ids
    assert run(tool, session, "print('still fine')") == "still fine\n"


def test_requiring_an_isolation_mode_that_does_not_work_here_raises_tool_error():
    # As root 'userns' is refused (root uses 'namespaces'); as non-root 'namespaces' needs root.
    mode = "userns" if os.geteuid() == 0 else "namespaces"
    sandbox = SandboxTool(isolation=mode)
    with pytest.raises(ToolError, match="not available"):
        sandbox.session_start("s")
    assert sandbox.session_info("s") is None


# --------------------------------------------------------------------------------------------------- state


def test_state_persists_between_calls_of_a_session(tool, session):
    assert run(tool, session, "x = 1") == "(no output)"
    assert run(tool, session, "print(x)") == "1\n"
    run(tool, session, "import math\ndef area(r):\n    return math.pi * r * r")
    assert run(tool, session, "print(round(area(2), 3))") == "12.566\n"
    run(tool, session, "with open('notes.txt', 'w') as f:\n    f.write('kept')")
    assert run(tool, session, "print(open('notes.txt').read())") == "kept\n"


def test_final_expression_value_and_exceptions_come_back_as_text(tool, session):
    assert run(tool, session, "y = 20\ny + 22") == "42\n"
    assert run(tool, session, "print('a'); import sys; print('b', file=sys.stderr)") == "a\nb\n"
    error = run(tool, session, "def f():\n    return 1 / 0\nf()")
    assert "Traceback" in error and "ZeroDivisionError: division by zero" in error
    assert 'File "<cell' in error and "return 1 / 0" in error
    assert "<string>" not in error and "sandbox_worker" not in error  # the worker's own frames are not shown
    syntax = run(tool, session, "def broken(:\n    pass")
    assert "SyntaxError" in syntax
    assert run(tool, session, "print(y)") == "20\n"  # errors do not lose the state


def test_state_is_gone_after_session_end(tool):
    session_id = f"test-{uuid.uuid4().hex[:8]}"
    tool.session_start(session_id)
    run(tool, session_id, "x = 'secret state'")
    info = tool.session_info(session_id)
    assert info is not None and os.path.isdir(info.workdir)
    tool.session_end(session_id)
    tool.session_end(session_id)  # idempotent
    assert tool.session_info(session_id) is None
    assert not os.path.exists(info.workdir)
    assert _wait_until(lambda: _gone(info.pids))
    tool.session_start(session_id)  # the same id again: a brand-new interpreter
    try:
        assert "NameError" in run(tool, session_id, "print(x)")
    finally:
        tool.session_end(session_id)


def test_sessions_do_not_see_each_others_variables_or_files(tool):
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    tool.session_start(a)
    tool.session_start(b)
    try:
        run(tool, a, "x = 'from a'\nopen('secret.txt', 'w').write('top secret of a')")
        path_a = run(tool, a, "import os\nprint(os.path.abspath('secret.txt'))").strip()
        assert "NameError" in run(tool, b, "print(x)")
        assert run(tool, b, "import os\nprint(os.path.exists('secret.txt'))") == "False\n"
        stolen = run(tool, b, f"print(open({path_a!r}).read())")
        assert "top secret of a" not in stolen
        assert "Error" in stolen  # FileNotFoundError (private mounts) or PermissionError (per-session uid)
        assert run(tool, a, "print(x)") == "from a\n"
        assert tool.session_info(a).workdir != tool.session_info(b).workdir
    finally:
        tool.session_end(a)
        tool.session_end(b)


# --------------------------------------------------------------------------------------------------- limits


def test_infinite_loop_times_out_kills_the_process_and_restarts_the_session():
    sandbox = SandboxTool(timeout_s=1.0)
    sandbox.session_start("loop")
    try:
        run(sandbox, "loop", "x = 1")
        old_pids = sandbox.session_info("loop").pids
        assert old_pids and not _gone(old_pids)
        with pytest.raises(ToolError, match=r"timed out after 1 s.*killed.*lost"):  # the sandbox's own limit
            run(sandbox, "loop", "while True:\n    pass")
        assert _gone(old_pids)  # the old interpreter is dead and reaped when the call returns
        assert run(sandbox, "loop", "print('x' in globals())") == "False\n"  # fresh interpreter, usable
        new_pids = sandbox.session_info("loop").pids
        assert new_pids and not set(new_pids) & set(old_pids)
    finally:
        sandbox.close()
    assert _gone(new_pids)


def test_session_end_during_a_running_call_stops_it_and_leaves_no_process(tool):
    tool.session_start("cancelled")
    info = tool.session_info("cancelled")
    pids = info.pids
    started = Path(info.workdir) / "started"
    outcome: list[BaseException | str] = []

    def call() -> None:
        code = "open('started', 'w').close()\nimport time\nwhile True:\n    time.sleep(0.05)"
        try:
            outcome.append(run(tool, "cancelled", code))
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    assert _wait_until(started.exists)  # the call is running inside the sandbox
    tool.session_end("cancelled")
    worker.join(timeout=600)
    assert not worker.is_alive()
    # "closed", not the call's own 5 s "timed out": session_end stopped it
    assert isinstance(outcome[0], ToolError) and "closed" in str(outcome[0]), outcome
    assert _gone(pids)


def test_fork_bomb_is_bounded_and_leaves_no_processes():
    sandbox = SandboxTool(timeout_s=3.0, max_processes=16, memory_limit_mb=256, cpu_time_limit_s=5)
    if not sandbox.isolation.process_limit:
        pytest.skip(f"isolation mode {sandbox.isolation.mode!r} has no per-session process limit: unsafe to run")
    sandbox.session_start("bomb")
    try:
        info = sandbox.session_info("bomb")
        try:
            observation = run(sandbox, "bomb", "import os\nwhile True:\n    os.fork()")
        except ToolError as exc:
            observation = str(exc)
        assert "BlockingIOError" in observation or "timed out" in observation
        if info.uid is not None:
            assert len(_uid_processes(info.uid)) <= 16  # RLIMIT_NPROC held
        assert subprocess.run(["true"], timeout=10).returncode == 0  # the machine can still start processes
        assert run(sandbox, "bomb", "print('still usable')") == "still usable\n"
    finally:
        sandbox.close()
    assert _gone(info.pids)
    if info.uid is not None:
        assert _wait_until(lambda: not _uid_processes(info.uid))


def test_memory_bomb_raises_memory_error_inside_the_sandbox(tool, session):
    observation = run(tool, session, "x = bytearray(4 * 1024**3)")
    assert "MemoryError" in observation
    assert run(tool, session, "print(len(bytearray(10**6)))") == "1000000\n"  # the interpreter survived


def test_cpu_time_limit_kills_the_interpreter_and_the_next_call_starts_fresh():
    sandbox = SandboxTool(timeout_s=10.0, cpu_time_limit_s=1)
    sandbox.session_start("cpu")
    try:
        run(sandbox, "cpu", "x = 1")
        with pytest.raises(ToolError, match="CPU time limit"):  # the 1 s CPU limit, not the 10 s wall limit
            run(sandbox, "cpu", "while True:\n    pass")
        assert run(sandbox, "cpu", "print('x' in globals())") == "False\n"
    finally:
        sandbox.close()


def test_huge_print_is_truncated_with_a_marker_and_the_observation_is_bounded(tool, session):
    observation = run(tool, session, "print('x' * 10**8)")
    cap = tool.max_output_bytes
    assert observation.startswith("x" * cap)
    assert f"[output truncated: {10**8 + 1 - cap} more bytes not shown" in observation
    assert len(observation.encode()) < cap + 200
    # output written straight to the file descriptor (as subprocesses do) is capped too
    raw = run(tool, session, "import os\nos.write(1, b'y' * 100_000)\nNone")
    assert raw.startswith("y" * 100) and "[output truncated: " in raw and len(raw.encode()) < cap + 200
    assert run(tool, session, "print('small')") == "small\n"  # the cap resets per call


def test_subprocess_output_is_captured(tool, session):
    assert run(tool, session, "import subprocess\n_ = subprocess.run(['echo', 'from a child'])") == "from a child\n"


# --------------------------------------------------------------------------------------------------- isolation


class _CountingHandler(socketserver.BaseRequestHandler):
    connections = 0

    def handle(self) -> None:
        type(self).connections += 1
        self.request.sendall(b"hello")


def test_network_connections_fail_inside_the_sandbox(tool, session):
    if not tool.isolation.network:
        pytest.skip(f"isolation mode {tool.isolation.mode!r} has no network namespace on this machine")
    _CountingHandler.connections = 0
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _CountingHandler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.server_address[1]
        try:
            import socket

            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:  # the server works
                assert client.recv(5) == b"hello"
            assert _wait_until(lambda: _CountingHandler.connections == 1)
            code = (
                "import socket\n"
                f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "print('connected', s.recv(5))"
            )
            observation = run(tool, session, code)
        finally:
            server.shutdown()
    assert "connected" not in observation
    assert "OSError" in observation or "unreachable" in observation
    assert _CountingHandler.connections == 1  # only the test's own connection


def test_parent_environment_is_not_visible(tool, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENTIC_RL_TEST_SECRET", secret)
    tool.session_start("env")
    try:
        observation = run(tool, "env", "import os, json\nprint(json.dumps(dict(os.environ)))")
        env = json.loads(observation)
        assert secret not in observation
        assert set(env) <= ALLOWED_ENV
        assert env["HOME"] == env["TMPDIR"] == tool.session_info("env").workdir
    finally:
        tool.session_end("env")


def test_working_directory_is_private_and_removed_at_session_end(tool):
    tool.session_start("cwd")
    info = tool.session_info("cwd")
    try:
        assert run(tool, "cwd", "import os\nprint(os.getcwd())").strip() == info.workdir
        mode = os.stat(info.workdir).st_mode
        assert not mode & (stat.S_IRWXG | stat.S_IRWXO)  # 0700: no other session or user can look in
        run(tool, "cwd", "import os\nos.makedirs('sub/dir')\nopen('sub/dir/f', 'w').write('x')\nos.chmod('sub', 0)")
    finally:
        tool.session_end("cwd")
    assert not os.path.exists(info.workdir)  # removed even with an unreadable subdirectory


def test_unprivileged_uid_cannot_write_to_root_owned_places(tool, session):
    if not tool.isolation.unprivileged_uid:
        pytest.skip(f"isolation mode {tool.isolation.mode!r} runs as the calling user: writes are not restricted")
    name = f"escape_{uuid.uuid4().hex}"
    for directory in ("/etc", "/root", "/usr", "/"):
        observation = run(tool, session, f"open({os.path.join(directory, name)!r}, 'w').write('x')")
        assert "PermissionError" in observation or "Read-only" in observation, observation
        assert not os.path.exists(os.path.join(directory, name))
    assert run(tool, session, "import os\nprint(os.getuid() != 0, os.getgroups())") == "True []\n"


def test_the_worker_file_need_not_be_readable_by_the_session_uid(tool, monkeypatch, tmp_path):
    """The worker is read at start-up, before the privilege drop: it may live where the session uid cannot enter."""
    if not tool.isolation.unprivileged_uid:
        pytest.skip(f"isolation mode {tool.isolation.mode!r} runs as the calling user")
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    copy = hidden / "sandbox_worker.py"
    shutil.copyfile(sandbox_module._WORKER_PATH, copy)
    copy.chmod(0o600)
    monkeypatch.setattr(sandbox_module, "_WORKER_PATH", str(copy))
    session_id = f"test-{uuid.uuid4().hex[:8]}"
    tool.session_start(session_id)
    try:
        assert run(tool, session_id, f"import os\nos.access({str(copy)!r}, os.R_OK)") == "False\n"
        assert "ZeroDivisionError" in run(tool, session_id, "1 / 0")
        assert run(tool, session_id, "print(6 * 7)") == "42\n"
    finally:
        tool.session_end(session_id)


def test_writes_to_tmp_stay_private_to_the_session(tool, session):
    if not tool.isolation.private_tmp:
        pytest.skip(f"isolation mode {tool.isolation.mode!r} shares /tmp with the host")
    host_path = f"/tmp/escape_{uuid.uuid4().hex}"
    code = f"open({host_path!r}, 'w').write('x')\nimport os\nprint(os.path.exists({host_path!r}))"
    assert run(tool, session, code) == "True\n"  # the sandbox has its own /tmp
    assert not os.path.exists(host_path)  # the host's /tmp is untouched


# --------------------------------------------------------------------------------------------------- concurrency


def test_32_concurrent_sessions_compute_independent_results(tool):
    def job(i: int) -> str:
        session_id = f"concurrent-{i}"
        tool.session_start(session_id)
        try:
            run(tool, session_id, f"x = {i}\nopen('n.txt', 'w').write(str(x))")
            return run(tool, session_id, "print(x * x + int(open('n.txt').read()))")
        finally:
            tool.session_end(session_id)

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(job, range(32)))
    assert results == [f"{i * i + i}\n" for i in range(32)]


# --------------------------------------------------------------------------------------------------- environment


def test_tool_environment_runs_python_calls_per_trajectory_and_closes_the_session(tool):
    env = ToolEnvironment([tool])

    def tool_call(code: str) -> str:
        return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"

    async def scenario() -> list[str]:
        sample = await env.reset({"id": "traj-sandbox", "question": "What is 6 * 7?"})
        observations = []
        for code in ("x = 6 * 7\nprint(x)", "print(x + 1)", "1 / 0"):
            sample.messages.append({"role": "assistant", "content": tool_call(code)})
            result = await env.step(sample)
            observations.append(result.observation[0]["content"])
        assert tool.session_info("traj-sandbox") is not None
        await env.close(sample)
        return observations

    first, second, third = anyio.run(scenario)
    assert (first, second) == ("42\n", "43\n")
    assert "ZeroDivisionError" in third
    assert tool.session_info("traj-sandbox") is None


# --------------------------------------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize("mode", ["uid", "none"])
def test_fallback_isolation_modes_keep_state_and_clean_up_after_a_timeout(mode):
    sandbox = SandboxTool(timeout_s=1.0, isolation=mode)
    try:
        sandbox.isolation  # noqa: B018
    except ToolError as exc:
        pytest.skip(f"isolation mode {mode!r} does not work on this machine: {exc}")
    sandbox.session_start("fallback")
    try:
        run(sandbox, "fallback", "x = 41")
        assert run(sandbox, "fallback", "x + 1") == "42\n"
        pids = sandbox.session_info("fallback").pids
        with pytest.raises(ToolError, match="timed out"):
            run(sandbox, "fallback", "import subprocess\nsubprocess.Popen(['sleep', '60'])\nwhile True:\n    pass")
        assert _wait_until(lambda: _gone(pids))
        assert "NameError" in run(sandbox, "fallback", "x")
    finally:
        sandbox.close()
