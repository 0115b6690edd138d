"""The container backends of coding workspaces (`agentic_rl.tools.workspace_container`): real podman / docker, no mocks.

The backend tests run the whole path against the real binary: a task's reset, bash calls that keep their working
directory, a file edit, the tests as the reward, and nothing left once the trajectory ends, the run is stopped by
SIGTERM, or killed with SIGKILL and swept by the next run. Each is skipped, with the reason, where the binary is
missing, its daemon or runtime does not answer (``<binary> info``, or a trial ``run`` of the image fails), or the
image is not present locally; nothing is ever pulled. The image: ``AGENTIC_RL_TEST_IMAGE`` (default
``python:3.11-slim``; it needs ``python3``; the tests are plain Python, no pytest in the image); more ``run`` arguments: ``AGENTIC_RL_TEST_CONTAINER_ARGS``
(shell words, e.g. ``--runtime runc``). The unit tests below them need no binary.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentic_rl.environments.workspace import WorkspaceEnvironment
from agentic_rl.errors import ConfigError, EnvStepError, RewardError, ToolUnavailableError
from agentic_rl.rewards.registry import REWARDS
from agentic_rl.tools import workspace_ops
from agentic_rl.tools.workspace import Workspaces
from agentic_rl.tools.workspace_config import WorkspaceConfig
from agentic_rl.tools.workspace_container import (
    CONTAINER_ROOT,
    OWNER_LABEL,
    container_unavailable,
    run_command,
    stale_containers,
)
from agentic_rl.tools.workspace_owner import owner_marker

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="containers need Linux")

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("AGENTIC_RL_TEST_IMAGE", "python:3.11-slim")
RUN_ARGS = shlex.split(os.environ.get("AGENTIC_RL_TEST_CONTAINER_ARGS", ""))
BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\nassert add(2, 3) == 5\n"
_WHY_NOT: dict[str, str | None] = {}


def _why_not(binary: str) -> str | None:
    """Why `binary` cannot run the test image here (None: it can), probed once per binary."""
    if binary not in _WHY_NOT:
        why = container_unavailable(binary, IMAGE)
        if why is None:
            trial = [binary, "run", "--rm", "--pull", "never", "--network", "none", *RUN_ARGS, IMAGE]
            try:
                done = subprocess.run([*trial, "python3", "-c", "pass"], capture_output=True, timeout=120)
                if done.returncode != 0:
                    why = f"a trial container of {IMAGE} failed: {done.stderr.decode(errors='replace')[-300:]}"
            except subprocess.TimeoutExpired:
                why = f"a trial container of {IMAGE} did not finish in 120 s"
        _WHY_NOT[binary] = why
    return _WHY_NOT[binary]


@pytest.fixture(params=["podman", "docker"])
def backend(request) -> str:
    why = _why_not(request.param)
    if why is not None:
        pytest.skip(f"{request.param} backend: {why}")
    return request.param


def _config(backend: str, root: Path, **more: Any) -> dict[str, Any]:
    return {"backend": backend, "root": str(root), "container_args": RUN_ARGS, "memory_limit_mb": 256, **more}


def _exists(binary: str, container: str) -> bool:
    return subprocess.run([binary, "container", "inspect", container], capture_output=True).returncode == 0


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.fixture
def codebase(tmp_path) -> Path:
    root = tmp_path / "calc"
    root.mkdir(mode=0o755)
    (root / "calc.py").write_text(BUGGY)
    return root


@pytest.fixture
async def env(backend, tmp_path) -> AsyncIterator[WorkspaceEnvironment]:
    environment = WorkspaceEnvironment(workspace=_config(backend, tmp_path / "workspaces"))
    yield environment
    await environment.aclose()
    assert os.listdir(tmp_path / "workspaces") == []


async def _act(env: WorkspaceEnvironment, sample: Any, name: str, **arguments: Any) -> str:
    call = {"name": name, "arguments": arguments}
    sample.messages.append({"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"})
    result = await env.step(sample)
    sample.messages.extend(result.observation)
    return result.observation[0]["content"]


def _task(codebase: Path, **more: Any) -> dict[str, Any]:
    return {"id": "t", "question": "Fix add.", "workspace": str(codebase), "trajectory_id": os.urandom(4).hex(),
            "image": IMAGE, "test_files": {"test_calc.py": TESTS}, "test_command": "python3 test_calc.py",
            **more}  # fmt: skip


async def _reward(sample: Any) -> Any:
    return await anyio.to_thread.run_sync(REWARDS["workspace_tests"], sample.task, sample.messages)


# --------------------------------------------------------------------------------------------------- real backends


async def test_a_task_runs_in_its_container_is_rewarded_by_its_tests_and_close_leaves_nothing(env, backend, codebase):
    sample = await env.reset(_task(codebase))
    assert "/workspace/pkg\n[exit code: 0]" in await _act(env, sample, "bash", command="mkdir -p pkg && cd pkg && pwd")
    assert await _act(env, sample, "bash", command="export V=1; pwd; exit 3") == "/workspace/pkg\n[exit code: 3]"
    assert await _act(env, sample, "bash", command="echo $V") == "1\n[exit code: 0]"
    offline = "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\""
    assert "[exit code: 0]" not in await _act(env, sample, "bash", command=offline)
    assert "outside the workspace" in await _act(env, sample, "view", path="../etc/passwd")
    await _act(env, sample, "bash", command="ln -s /etc/passwd /workspace/leak")
    assert "leads outside the workspace through a symbolic link" in await _act(env, sample, "view", path="leak")
    cut = await _act(env, sample, "bash", command="python3 -c \"print('é' * 20000)\"")
    assert "bytes of output left out" in cut and "\ufffd" not in cut
    assert await _reward(sample) == 0.0  # the bug is still there
    fixed = await _act(env, sample, "str_replace", path="calc.py", old_str="a - b", new_str="a + b")
    assert fixed.startswith("Edited calc.py")
    info = env.workspaces.info(sample.id)
    assert info.path == CONTAINER_ROOT and info.overlay is False and _exists(backend, info.container)
    assert (Path(info.folder) / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    reward = await _reward(sample)
    assert reward == 1.0 and reward.metrics["tests_exit_status"] == 0.0 and reward.metrics["workspace_overlay"] == 0.0
    # As under the sandbox: the hidden test was there for the run only, and the shell starts afresh after it.
    after = await _act(env, sample, "bash", command="pwd; echo ${V:-forgotten}; ls")
    assert after.splitlines()[:2] == ["/workspace", "forgotten"] and "test_calc.py" not in after, after
    await env.close(sample)
    assert not _exists(backend, info.container) and not os.path.exists(info.folder)
    assert (codebase / "calc.py").read_text() == BUGGY


async def test_limits_in_a_container_make_infrastructure_failures_and_bash_survives_its_timeout(env, codebase):
    sample = await env.reset(_task(codebase, test_command="sleep 300", test_timeout_s=1))
    timed_out = await _act(env, sample, "bash", command="sleep 300", timeout_s=1)
    assert "[command timed out after 1 s" in timed_out
    assert "[exit code: 0]" in await _act(env, sample, "bash", command="true")
    with pytest.raises(RewardError, match="passed its time limit and was killed"):
        await _reward(sample)
    await env.close(sample)
    sample = await env.reset(_task(codebase, test_command="python3 -c 'bytearray(1024**3)'"))  # past 256 MiB
    with pytest.raises(RewardError, match="killed by SIGKILL|MemoryError"):
        await _reward(sample)
    await env.close(sample)


_OWNER = textwrap.dedent("""
    import json, signal, sys, time
    from agentic_rl.tools.workspace import Workspaces

    def stop(signum, frame):
        raise KeyboardInterrupt  # as the agentic-rl command does

    signal.signal(signal.SIGTERM, stop)
    manager = Workspaces(json.loads(sys.argv[1]))
    manager.register("s", sys.argv[2])
    args = {"command": "sleep 1000 > /dev/null 2>&1 &", "timeout_s": 10, "max_output_bytes": 1000}
    manager.call("s", "bash", args, timeout_s=60)
    info = manager.info("s")
    print(json.dumps({"container": info.container, "folder": info.folder}), flush=True)
    time.sleep(600)
""")


def _owner(backend: str, root: Path, codebase: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A run in another process holding one workspace, with a command left running in it."""
    config = json.dumps(_config(backend, root, image=IMAGE))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, config, str(codebase)], stdout=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the owner process failed (status {proc.wait()})"
    return proc, json.loads(line)


def test_a_run_stopped_by_sigterm_removes_its_containers_and_folders(backend, tmp_path, codebase):
    proc, live = _owner(backend, tmp_path / "ws", codebase)
    assert _exists(backend, live["container"])
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert not _exists(backend, live["container"]) and os.listdir(tmp_path / "ws") == []


def test_a_killed_runs_container_is_swept_by_the_next_run_and_only_it(backend, tmp_path, codebase):
    proc, dead = _owner(backend, tmp_path / "ws", codebase)
    ours = Workspaces(_config(backend, tmp_path / "ws", image=IMAGE))
    try:
        ours.register("mine", codebase)
        ours.call("mine", "bash", {"command": "true", "timeout_s": 10, "max_output_bytes": 1000}, timeout_s=60)
        proc.kill()
        proc.wait()
        assert _exists(backend, dead["container"]) and os.path.exists(dead["folder"])  # what kill -9 leaves
        resumed = Workspaces(_config(backend, tmp_path / "ws", image=IMAGE))  # the sweep runs here
        resumed.close()
        assert not _exists(backend, dead["container"]) and not os.path.exists(dead["folder"])
        mine = ours.info("mine")
        assert _exists(backend, mine.container) and os.path.exists(mine.folder)  # a live run's: kept
    finally:
        ours.close()
    assert _wait_until(lambda: not _exists(backend, mine.container)) and os.listdir(tmp_path / "ws") == []


# --------------------------------------------------------------------------------------------------- no binary needed


def test_the_config_names_a_backend_and_refuses_what_it_cannot_honour():
    assert WorkspaceConfig().backend == "sandbox" and WorkspaceConfig().image is None
    with pytest.raises(ConfigError, match="image is for the container backends"):
        WorkspaceConfig(image="python:3.11-slim")
    with pytest.raises(ConfigError, match="copy_mode 'overlay' needs backend 'sandbox'"):
        WorkspaceConfig(backend="podman", copy_mode="overlay")
    with pytest.raises(ConfigError, match="backend"):
        WorkspaceConfig(backend="lxc")


async def test_a_task_naming_an_image_under_the_sandbox_backend_is_refused_at_reset(tmp_path, codebase):
    root = tmp_path / "ws"
    env = WorkspaceEnvironment(workspace={"root": str(root)})
    try:
        with pytest.raises(EnvStepError, match="names the container image 'python:3.11-slim', but the workspaces use"):
            await env.reset(_task(codebase, image="python:3.11-slim"))
    finally:
        await env.aclose()
    manager = Workspaces({"backend": "docker", "root": str(root)})
    try:
        with pytest.raises(ConfigError, match="backend 'docker' needs an image"):
            manager.register("s", codebase)
        with pytest.raises(ConfigError, match="task field 'image' must name a container image"):
            manager.register("s", codebase, image=3)
    finally:
        manager.close()
    assert os.listdir(root) == []


@pytest.mark.parametrize("binary", ["podman", "docker"])
async def test_a_container_backend_that_cannot_run_the_task_s_image_refuses_the_task_at_reset(tmp_path, codebase, binary):
    # Whatever this machine has (no binary, no daemon, or the binary without this image), the task is refused when
    # its trajectory starts, saying why; no tool call is left to fail and be retried.
    image = "localhost/agentic-rl-no-such-image"
    why = container_unavailable(binary, image)
    assert why is not None
    env = WorkspaceEnvironment(workspace={"root": str(tmp_path / "ws"), "backend": binary})
    try:
        with pytest.raises(EnvStepError) as info:
            await env.reset(_task(codebase, image=image))
        assert str(info.value) == f"backend {binary!r} cannot run image {image!r}: {why}"
    finally:
        await env.aclose()


def test_the_run_command_isolates_bounds_labels_and_mounts_the_workspace():
    config = WorkspaceConfig(backend="podman", memory_limit_mb=512, max_processes=64, max_file_mb=8,
                             cpu_time_limit_s=90, container_cpus=1.5, container_args=["--runtime", "runc"])  # fmt: skip
    command = run_command("podman", config, name="n", image="img:1", folder="/w/ws", labels={OWNER_LABEL: "{}"})
    text = shlex.join(command)
    for part in ("podman run --detach --pull never --name n --network none", "--memory 512m --memory-swap 512m",
                 "--pids-limit 64", "--ulimit cpu=90:90", f"--ulimit fsize={8 * 2**20}:{8 * 2**20}", "--cpus 1.5",
                 "--tmpfs /tmp:rw,nosuid,nodev,size=8m,mode=1777", "--cap-drop ALL", "--stop-signal SIGKILL",
                 f"--label '{OWNER_LABEL}={{}}'", f"--mount type=bind,source=/w/ws,target={CONTAINER_ROOT}",
                 "--entrypoint python3 --runtime runc img:1 -c"):  # fmt: skip
        assert part in text, part
    assert sum("readonly" in c for c in command) == 2  # the ops module and the helpers it imports
    with pytest.raises(ToolUnavailableError, match="has a comma"):
        run_command("podman", config, name="n", image="img", folder="/w/a,b", labels={})


def test_a_sweep_selects_only_containers_whose_owner_is_dead():
    here = owner_marker()
    finished = subprocess.Popen(["true"])
    finished.wait()
    dead = {**here, "pid": finished.pid}  # its start ticks no longer match any process
    labels = {
        "live": {OWNER_LABEL: json.dumps(here)},
        "dead": {OWNER_LABEL: json.dumps(dead)},
        "rebooted": {OWNER_LABEL: json.dumps({**here, "boot_id": "another boot"})},
        "other-namespace": {OWNER_LABEL: json.dumps({**dead, "pid_namespace": -1})},
        "unlabelled": {},
        "garbled": {OWNER_LABEL: "{not json"},
    }
    assert stale_containers(labels, here) == ["dead", "rebooted"]


def test_container_unavailable_names_a_missing_binary():
    missing = "agentic-rl-no-such-binary"
    assert container_unavailable(missing) == f"{missing} is not installed (not on PATH)"


def test_the_shell_working_directory_and_exports_survive_a_new_process_through_the_state_file(tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    state = str(tmp_path / "state.json")

    def bash(command: str) -> str:
        request = {"op": "bash", "root": str(tmp_path), "state": state,
                   "args": {"command": command, "timeout_s": 10, "max_output_bytes": 1000}}  # fmt: skip
        workspace_ops._STATE.clear()  # as a fresh process starts
        workspace_ops.main(json.dumps(request))
        return json.loads(capsys.readouterr().out.split(workspace_ops.REPLY_MARKER)[1])["ok"]

    assert bash("cd sub && export V='é 1'") == "(no output)\n[exit code: 0]"
    assert bash('pwd; echo "$V"') == f"{tmp_path}/sub\né 1\n[exit code: 0]"
    workspace_ops._STATE.clear()
