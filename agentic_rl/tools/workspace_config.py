"""The settings of coding workspaces (`WorkspaceConfig`), and a task's tests: what to run (`TestSpec`) and what ran
(`TestRun`)."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field, model_validator

from agentic_rl.config import Config
from agentic_rl.errors import ConfigError

__all__ = ["TestRun", "TestSpec", "WorkspaceConfig"]


class WorkspaceConfig(Config):
    """How coding workspaces are made and bounded (`agentic_rl.tools.workspace.Workspaces`). Every bound applies to
    the workspace's sandbox (`agentic_rl.tools.sandbox.SandboxTool` has the details), or with a container backend
    to its container (`agentic_rl.tools.workspace_container` maps them).

    Raises:
        ConfigError: for a bad field, bash_timeout_s above bash_max_timeout_s, an `image` under the sandbox backend,
            or copy_mode ``"overlay"`` with a container backend.
    """

    root: str | None = Field(
        default=None,
        description="folder holding the runs' workspace folders (None: agentic-rl-workspaces-<uid> in the temp dir)",
    )
    copy_mode: Literal["auto", "overlay", "copy"] = Field(
        default="auto",
        description="auto: an overlay on the code base where the kernel allows it, else a copy; overlay: require it",
    )
    max_concurrent_starts: int = Field(default=4, ge=1, description="most workspaces starting at once")
    max_codebase_mb: float = Field(default=512.0, gt=0, description="largest code base accepted, in MiB")
    max_output_bytes: int = Field(
        default=8000, ge=256, description="most bytes of one tool result (a command's output: its head and tail)"
    )
    bash_timeout_s: float = Field(default=30.0, gt=0, description="a command's time limit when the call gives none")
    bash_max_timeout_s: float = Field(default=300.0, gt=0, description="the largest timeout_s a bash call may ask")
    op_timeout_s: float = Field(default=30.0, gt=0, description="time limit of one file tool call, in seconds")
    test_timeout_s: float = Field(default=45.0, gt=0, description="a test run's time limit when the task gives none")
    memory_limit_mb: int = Field(default=2048, ge=64, description="address space of each sandbox process, in MiB")
    cpu_time_limit_s: float = Field(default=600.0, gt=0, description="CPU seconds of each sandbox process")
    max_processes: int = Field(default=256, ge=8, description="most processes and threads of a workspace")
    max_file_mb: int = Field(default=256, ge=1, description="largest file written, and each private tmpfs, in MiB")
    startup_timeout_s: float = Field(default=60.0, gt=0, description="time limit of starting a sandbox interpreter")
    isolation: Literal["auto", "namespaces", "userns", "uid", "none"] = Field(
        default="auto", description="the sandbox's isolation mode (auto: the strongest that works here)"
    )
    backend: Literal["sandbox", "podman", "docker"] = Field(
        default="sandbox",
        description="where workspaces run: the namespaces sandbox, or one podman / docker container per workspace",
    )
    image: str | None = Field(
        default=None,
        description="container backends: the image of a task that names none (present locally: never pulled)",
    )
    container_cpus: float | None = Field(default=None, gt=0, description="container backends: CPUs per container")
    container_args: list[str] = Field(
        default_factory=list,
        description="container backends: more arguments of `<backend> run`, e.g. ['--runtime', 'runc']",
    )

    @model_validator(mode="after")
    def _timeouts(self) -> WorkspaceConfig:
        if self.bash_timeout_s > self.bash_max_timeout_s:
            raise ValueError(f"bash_timeout_s={self.bash_timeout_s:g} exceeds bash_max_timeout_s")
        if self.backend == "sandbox" and self.image is not None:
            raise ValueError("image is for the container backends: set backend to 'podman' or 'docker'")
        if self.backend != "sandbox" and self.copy_mode == "overlay":
            raise ValueError(f"copy_mode 'overlay' needs backend 'sandbox' (a {self.backend} workspace is a copy)")
        if self.image is not None and not self.image.strip():
            raise ValueError("image must name a container image, e.g. 'python:3.11-slim'")
        return self


def _node_ids(task: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """A task's list of pytest node ids: a list, or a JSON string holding one (as SWE-bench stores them)."""
    value = task.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"task field {name!r} must be a list of pytest node ids, got a string") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"task field {name!r} must be a list of pytest node ids (non-empty strings)")
    return tuple(value)


@dataclass(frozen=True)
class TestSpec:
    """The tests of a task, run in its workspace after the episode.

    Attributes:
        command: shell command run with ``bash -c`` in the workspace root.
        files: hidden test files, relative path -> content, written into the workspace just before the run.
        listed: pytest node ids (``fail_to_pass`` then ``pass_to_pass``) that must all pass; empty: the command's
            exit status decides.
        timeout_s: wall-clock limit of the run, in seconds.
    """

    __test__ = False  # not a pytest test class

    command: str
    files: dict[str, str]
    listed: tuple[str, ...]
    timeout_s: float

    @classmethod
    def from_task(cls, task: Mapping[str, Any], *, default_timeout_s: float) -> TestSpec | None:
        """The tests a task names: ``test_command`` (default with node ids: ``python -m pytest`` on them),
        ``test_files``, ``fail_to_pass`` / ``pass_to_pass`` (lists, or JSON strings of lists), ``test_timeout_s``
        (default `default_timeout_s`).

        Returns:
            The spec, or None when the task names neither a command nor node ids.

        Raises:
            ConfigError: naming the malformed field.
        """
        listed = tuple(dict.fromkeys(_node_ids(task, "fail_to_pass") + _node_ids(task, "pass_to_pass")))
        command = task.get("test_command")
        if command is not None and (not isinstance(command, str) or not command.strip()):
            raise ConfigError("task field 'test_command' must be a non-empty shell command")
        if command is None and not listed:
            return None
        if command is None:
            command = "python -m pytest -q -p no:cacheprovider " + " ".join(shlex.quote(i) for i in listed)
        files = task.get("test_files") or {}
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in files.items()
        ):
            raise ConfigError("task field 'test_files' must map relative file paths to their text")
        for name in files:
            parts = PurePosixPath(name).parts
            if PurePosixPath(name).is_absolute() or ".." in parts:
                raise ConfigError(f"task field 'test_files' names {name!r}: give a path inside the workspace")
        timeout_s = task.get("test_timeout_s", default_timeout_s)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
            raise ConfigError(f"task field 'test_timeout_s' must be a positive number of seconds, got {timeout_s!r}")
        return cls(command, dict(files), listed, float(timeout_s))


@dataclass(frozen=True)
class TestRun:
    """What a test run gave (`Workspaces.run_tests`).

    Attributes:
        returncode: the command's exit status (negative: killed by that signal), or None when it passed its time
            limit and was killed.
        report: whether pytest wrote a JUnit XML report that was read.
        total: test cases in the report.
        passed: of them, those that passed.
        listed: how many node ids the spec listed.
        listed_passed: of them, those that passed (a test missing from the report did not).
        not_passed: up to 20 listed ids that did not pass, with their outcome (``failed``, ``error``, ``skipped``,
            ``missing``).
        memory_errors: failed test cases whose failure mentions a `MemoryError` (the sandbox's memory limit).
        tail: the last 2000 bytes of the command's output.
        seconds: wall-clock time of the run, interpreter start included.
        overlay: whether the workspace is an overlay (False: a copy).
    """

    __test__ = False

    returncode: int | None
    report: bool
    total: int
    passed: int
    listed: int
    listed_passed: int
    not_passed: dict[str, str]
    memory_errors: int
    tail: str
    seconds: float
    overlay: bool
