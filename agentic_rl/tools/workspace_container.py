"""The container backends of coding workspaces (`WorkspaceConfig.backend` ``"podman"`` or ``"docker"``).

A workspace's host folder (the copy `agentic_rl.tools.workspace.Workspaces` makes) is bind-mounted at
`CONTAINER_ROOT` into a container of its own, started from the task's image (`run_command` has the whole command
line): no network (``--network none``), its own PID namespace, the `WorkspaceConfig` limits mapped to the
container's (``memory_limit_mb`` -> ``--memory`` of the whole container, no swap; ``max_processes`` ->
``--pids-limit``; ``cpu_time_limit_s`` and ``max_file_mb`` -> per-process ``--ulimit cpu`` / ``fsize``;
``container_cpus`` -> ``--cpus``), a private ``/tmp`` tmpfs of ``max_file_mb``, every capability dropped, no new
privileges, and labels naming the run and its owner process (`owner_marker`). The container's first process is a
small Python loop that reaps orphans, so the image must have ``python3`` (3.9 or later) on its ``PATH``; images are
never pulled (``--pull never``): pull or build them beforehand.

Every tool call runs `workspace_ops` (bind-mounted read-only with the helpers it imports) in a fresh
``<binary> exec`` in the workspace, the request on its stdin: the same checks, error texts and path rules as under
the sandbox, with the container as the boundary. The shell's working directory is kept between calls in a state
file on the container's ``/tmp``. A call past its time limit kills every process of the container but its first;
`ContainerBackend.remove` (``rm -f``) removes the container with all its processes. `sweep_stale_containers` removes
the containers of dead runs (by their owner label, the rule of `sweep_stale_workspaces`) and only those.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from agentic_rl.errors import ConfigError, ToolError, ToolUnavailableError
from agentic_rl.tools import sandbox_worker, workspace_ops
from agentic_rl.tools.workspace_config import WorkspaceConfig
from agentic_rl.tools.workspace_owner import owner_dead, owner_marker

__all__ = [
    "CONTAINER_ROOT",
    "OWNER_LABEL",
    "RUN_LABEL",
    "STATE_FILE",
    "ContainerBackend",
    "container_unavailable",
    "exec_command",
    "run_command",
    "stale_containers",
    "sweep_stale_containers",
]

logger = logging.getLogger(__name__)

CONTAINER_ROOT = "/workspace"
"""Where the workspace folder is mounted in its container: the workspace root the tools show."""
OWNER_LABEL = "io.agentic-rl.owner"
"""The label holding the owning process's `owner_marker` as JSON."""
RUN_LABEL = "io.agentic-rl.run"
"""The label naming the run (its `Workspaces` token)."""
STATE_FILE = "/tmp/.agentic-rl-workspace-state.json"
"""Where `workspace_ops` keeps the shell's working directory between two calls, in the container."""
_OPS_DIR = "/opt/agentic-rl-ops"
_MOUNTED = {  # module name in the container -> host file
    "agentic_rl_workspace_ops": os.path.abspath(workspace_ops.__file__),
    "agentic_rl_sandbox_worker": os.path.abspath(sandbox_worker.__file__),
}
_INIT = (
    "import os, time\nwhile True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(1)"
)
_EXEC = f"import sys; sys.path.insert(0, {_OPS_DIR!r}); import agentic_rl_workspace_ops as o; o.main(sys.stdin.read())"
# Every process but the first and this one, and the shell's kept state (as a restarted sandbox session forgets it).
_KILL_ALL = (
    f"import contextlib, os, signal\nwith contextlib.suppress(FileNotFoundError): os.unlink({STATE_FILE!r})\n"
    "with contextlib.suppress(ProcessLookupError): os.kill(-1, signal.SIGKILL)"  # ESRCH: there was none
)
_CLI_TIMEOUT_S = 60.0  # one `ps`, `inspect`, `rm`


def run_command(
    binary: str, config: WorkspaceConfig, *, name: str, image: str, folder: str, labels: Mapping[str, str]
) -> list[str]:
    """The ``<binary> run`` command line that starts a workspace's container (see the module docstring).

    Args:
        binary: ``podman`` or ``docker`` (or a path to one).
        config: the limits and `WorkspaceConfig.container_args` (placed just before the image).
        name: the container's name.
        image: the image, present locally.
        folder: the workspace's host folder, mounted read-write at `CONTAINER_ROOT`.
        labels: more labels, name -> value.

    Raises:
        ToolUnavailableError: for a folder whose path has a comma (the ``--mount`` syntax cannot hold it).
    """
    if "," in folder:
        raise ToolUnavailableError(f"the workspace folder {folder!r} has a comma: choose a root without one")
    fsize = config.max_file_mb * 2**20
    cpu = max(1, int(config.cpu_time_limit_s))
    command = [binary, "run", "--detach", "--pull", "never", "--name", name, "--network", "none"]
    command += ["--memory", f"{config.memory_limit_mb}m", "--memory-swap", f"{config.memory_limit_mb}m"]
    command += ["--pids-limit", str(config.max_processes), "--ulimit", f"cpu={cpu}:{cpu}"]
    command += ["--ulimit", f"fsize={fsize}:{fsize}"]
    if config.container_cpus is not None:
        command += ["--cpus", f"{config.container_cpus:g}"]
    command += ["--tmpfs", f"/tmp:rw,nosuid,nodev,size={config.max_file_mb}m,mode=1777"]
    command += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--stop-signal", "SIGKILL"]
    for key, value in labels.items():
        command += ["--label", f"{key}={value}"]
    command += ["--mount", f"type=bind,source={folder},target={CONTAINER_ROOT}"]
    for module, path in _MOUNTED.items():
        command += ["--mount", f"type=bind,source={path},target={_OPS_DIR}/{module}.py,readonly"]
    command += ["--workdir", CONTAINER_ROOT, "--entrypoint", "python3", *config.container_args, image, "-c", _INIT]
    return command


def exec_command(binary: str, container: str, code: str = _EXEC) -> list[str]:
    """The ``<binary> exec`` command line running the Python `code` (default: one `workspace_ops` call read from
    stdin) in `container`, in the workspace root."""
    return [binary, "exec", "-i", "--workdir", CONTAINER_ROOT, container, "python3", "-c", code]


def _cli(command: list[str], timeout_s: float = _CLI_TIMEOUT_S, cwd: str | None = None) -> tuple[int, str, str]:
    """Runs a CLI command in `cwd`; ``(status, stdout, stderr)``, status -1 when it could not run or passed
    `timeout_s`."""
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"{command[0]} {command[1]} did not answer in {timeout_s:g} s"
    except OSError as exc:
        return -1, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def container_unavailable(binary: str, image: str | None = None) -> str | None:
    """Why containers of `binary` cannot run here: the binary is missing, its daemon / runtime does not answer
    (``<binary> info`` fails), or `image` is not present locally; None when they can (nothing is pulled)."""
    if shutil.which(binary) is None:
        return f"{binary} is not installed (not on PATH)"
    status, _, err = _cli([binary, "info"])
    if status != 0:
        return f"`{binary} info` failed: {err.strip()[-300:]}"
    if image is not None:
        status, _, err = _cli([binary, "image", "inspect", image])
        if status != 0:
            return f"the image {image!r} is not present locally ({binary} image inspect: {err.strip()[-200:]})"
    return None


def stale_containers(labels: Mapping[str, Mapping[str, str]], here: dict[str, Any]) -> list[str]:
    """Of containers (id -> labels), those whose `OWNER_LABEL` names a dead process (`owner_dead` against `here`,
    this process's `owner_marker`). A live owner's, one of another PID namespace, one without a readable label: kept.
    """
    stale = []
    for container, their in labels.items():
        try:
            owner = json.loads(their[OWNER_LABEL])
            if owner_dead(owner, here):
                stale.append(container)
        except (KeyError, ValueError, TypeError):
            continue
    return stale


def sweep_stale_containers(binary: str) -> list[str]:
    """Removes (``rm -f``) the containers of `binary` that dead runs left (`stale_containers`). Never raises: a
    binary that is missing or does not answer sweeps nothing.

    Returns:
        The ids of the containers removed.
    """
    if shutil.which(binary) is None:
        return []
    status, out, err = _cli([binary, "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label={OWNER_LABEL}"])
    ids = out.split()
    if status != 0 or not ids:
        if status != 0:
            logger.warning("could not list the containers of dead runs: %s", err.strip()[-300:])
        return []
    status, out, err = _cli([binary, "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", *ids])
    labels = {}
    for line in out.splitlines():  # a container removed meanwhile fails the command, but the others are listed
        container, _, text = line.partition(" ")
        try:
            labels[container] = json.loads(text) or {}
        except ValueError:
            continue
    removed = []
    for container in stale_containers(labels, owner_marker()):
        if _cli([binary, "rm", "--force", container])[0] == 0:
            removed.append(container)
            logger.info("removed the container %s of a dead run", container[:12])
    return removed


class ContainerBackend:
    """Starts, runs in and removes the containers of one `Workspaces` (see the module docstring). Thread-safe.

    Args:
        config: the workspaces' settings (`backend` names the binary).
        run: the run's token, the value of `RUN_LABEL`.
        folder: the run's folder, the working directory of the CLI's processes (podman's conmon may leave a file
            named ``oom`` in its working directory after an out-of-memory kill in an exec).
    """

    def __init__(self, config: WorkspaceConfig, run: str, folder: str) -> None:
        self.config = config
        self.folder = folder
        self.binary = config.backend
        self.labels = {RUN_LABEL: run, OWNER_LABEL: json.dumps(owner_marker(), separators=(",", ":"))}
        self.live: set[str] = set()  # containers started and not removed yet
        self._images: set[str] = set()  # images found present
        self._lock = threading.Lock()

    @property
    def _cwd(self) -> str | None:
        return self.folder if os.path.isdir(self.folder) else None

    def start(self, name: str, image: str, folder: str) -> str:
        """Starts the container `name` of the workspace `folder` from `image`.

        Returns:
            The container's name (what `call`, `kill_all` and `remove` take).

        Raises:
            ToolUnavailableError: if the binary is missing, or the container did not start within
                `WorkspaceConfig.startup_timeout_s` (an image not present locally, a daemon that does not answer).
        """
        if shutil.which(self.binary) is None:
            raise ToolUnavailableError(f"backend {self.binary!r}: {self.binary} is not installed (not on PATH)")
        command = run_command(self.binary, self.config, name=name, image=image, folder=folder, labels=self.labels)
        with self._lock:
            self.live.add(name)  # removed on failure too: a timed-out `run` may still create it
        status, _, err = _cli(command, self.config.startup_timeout_s, self._cwd)
        if status != 0:
            self.remove(name)
            raise ToolUnavailableError(
                f"the {self.binary} container of the workspace did not start: {err.strip()[-1000:]}"
            )
        return name

    def check_image(self, image: str) -> None:
        """Checks once per image that the backend answers and `image` is present locally (it is never pulled).

        Raises:
            ConfigError: saying why not (`container_unavailable`).
        """
        with self._lock:
            if image in self._images:
                return
        reason = container_unavailable(self.binary, image)
        if reason is not None:
            raise ConfigError(f"backend {self.binary!r} cannot run image {image!r}: {reason}")
        with self._lock:
            self._images.add(image)

    def call(self, container: str, request: str, *, timeout_s: float) -> str:
        """Runs one `workspace_ops` call (JSON `request`) in a fresh exec in `container`; returns its stdout.

        Raises:
            ToolError: past `timeout_s` seconds (every process of the container is killed then, and the shell's kept
                state forgotten; the files stay).
            ToolUnavailableError: if the exec could not start.
        """
        try:
            done = subprocess.run(
                exec_command(self.binary, container),
                input=request.encode("utf-8", "surrogatepass"),
                cwd=self._cwd,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.kill_all(container)
            raise ToolError(
                f"execution timed out after {timeout_s:g} s; every process in the workspace's container was "
                "killed (files in the workspace are kept)"
            ) from None
        except OSError as exc:
            raise ToolUnavailableError(f"could not run {self.binary} exec: {exc}") from exc
        return (done.stderr[-2000:] + done.stdout).decode("utf-8", "replace")  # the reply last: it is parsed

    def kill_all(self, container: str) -> None:
        """Kills every process of `container` but its first (the model's commands, whatever they left running), and
        forgets the shell's working directory and exports."""
        _cli(exec_command(self.binary, container, _KILL_ALL), cwd=self._cwd)

    def remove(self, container: str) -> None:
        """Removes `container` with all its processes (``rm -f``). Idempotent; never raises (a failure is logged)."""
        status, _, err = _cli([self.binary, "rm", "--force", container], cwd=self._cwd)
        if status != 0 and "no such container" not in err.lower() and "no container with" not in err.lower():
            logger.warning("could not remove the container %s: %s", container, err.strip()[-300:])
        with self._lock:
            self.live.discard(container)

    def remove_all(self) -> None:
        """Removes every container this backend started and did not remove yet."""
        with self._lock:
            live = list(self.live)
        for container in live:
            self.remove(container)
