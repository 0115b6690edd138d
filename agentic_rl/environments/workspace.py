"""`WorkspaceEnvironment`: a coding task in its own workspace, with shell and file tools, tests as the reward.

A task names its code base in ``workspace`` (a folder, or a ``.tar``, ``.tar.gz`` / ``.tgz``, ``.zip`` archive) and
its tests in ``test_command``, ``test_files``, ``fail_to_pass`` / ``pass_to_pass`` and ``test_timeout_s``
(`agentic_rl.tools.workspace_config.TestSpec`), and with a container backend (``workspace: {backend: podman}``) the
image its container starts from in ``image`` (default `WorkspaceConfig.image`). `reset` registers the code base for
the trajectory's id before any tool runs (a tool's `session_start` gets only that id) and adds ``workspace_session``
to the task the reward reads; the tools' sessions share that one workspace; `close` ends the tools' sessions and
lets the workspace go, which removes it. The ``workspace_tests`` reward (`agentic_rl.rewards.workspace`) runs the tests in it in between (the
harness calls the reward before `close`).

In a training config::

    environment: workspace            # or {class: workspace, kwargs: {workspace: {copy_mode: copy}, ...}}
    reward: workspace_tests
    rollout: {reward_timeout_s: 120}  # above the tests' time limit (test_timeout_s, default 45) plus a start
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from agentic_rl.environments.base import Sample, StepResult
from agentic_rl.environments.tool_env import MAX_OBSERVATION_CHARS, ToolEnvironment, ToolReply
from agentic_rl.errors import ConfigError, EnvStepError
from agentic_rl.tools.base import Tool
from agentic_rl.tools.workspace import ENVIRONMENT_HOLDER, Workspaces
from agentic_rl.tools.workspace_config import TestSpec, WorkspaceConfig
from agentic_rl.tools.workspace_tools import WORKSPACE_TOOL_NAMES
from agentic_rl.tools.workspace_tools import workspace_tools as build_workspace_tools

__all__ = ["WORKSPACE_SYSTEM_PROMPT", "WorkspaceEnvironment"]

logger = logging.getLogger(__name__)

WORKSPACE_SYSTEM_PROMPT = (
    "You are a software engineer working in a code base, your workspace. Use the tools to explore it, edit files "
    "and run commands; file paths are relative to the workspace root. When the task is done, reply with a short "
    "summary of what you changed and call no tool."
)

_RELEASE_TIMEOUT_S = 60.0  # killing a workspace's processes and removing its folder
_RESULT_NOTES = 192  # characters beside a tool's capped output: the exit code, a cut's marker, a view's hint


class WorkspaceEnvironment(ToolEnvironment):
    """A `ToolEnvironment` whose tools work in one private workspace per trajectory (see the module docstring).

    Args:
        tools: more tools offered beside the workspace tools (a training config's ``tools``).
        workspace: the workspaces' settings: a `WorkspaceConfig` or a mapping of its fields.
        workspace_tools: which workspace tools to offer, by name (default all: bash, view, create, str_replace,
            insert).
        system_prompt, tools_in_system_prompt, max_observation_chars, max_tool_threads, call_format: as for
            `ToolEnvironment`.

    Raises:
        ConfigError: for a bad setting or tool name, two tools with one name, or a `max_observation_chars` below
            the workspace's `max_output_bytes` (plus room for a result's notes).
    """

    def __init__(
        self,
        tools: Sequence[Tool] = (),
        *,
        workspace: WorkspaceConfig | Mapping[str, Any] | None = None,
        workspace_tools: Sequence[str] = WORKSPACE_TOOL_NAMES,
        system_prompt: str = WORKSPACE_SYSTEM_PROMPT,
        tools_in_system_prompt: bool = True,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
        max_tool_threads: int = 16,
        call_format: str | None = None,
    ) -> None:
        self.workspaces = Workspaces(workspace)
        try:
            room = self.workspaces.config.max_output_bytes + _RESULT_NOTES
            if max_observation_chars < room:  # else the environment's cut would drop a result's tail and exit code
                raise ConfigError(
                    f"max_observation_chars={max_observation_chars} is below the workspace's max_output_bytes="
                    f"{self.workspaces.config.max_output_bytes} plus {_RESULT_NOTES} for a result's notes: raise "
                    f"max_observation_chars to {room} or more"
                )
            own: list[Tool] = list(build_workspace_tools(self.workspaces, workspace_tools))
            super().__init__(
                [*own, *tools],
                system_prompt=system_prompt,
                tools_in_system_prompt=tools_in_system_prompt,
                max_observation_chars=max_observation_chars,
                max_tool_threads=max_tool_threads,
                call_format=call_format,
            )
        except BaseException:
            self.workspaces.close()
            raise

    async def reset(self, request: dict[str, Any]) -> Sample:
        """Starts a trajectory: checks the task's ``workspace`` and test fields, registers its code base (an archive
        is unpacked here, once per run) and its container ``image`` (container backends only) and adds
        ``workspace_session`` to the task.

        Raises:
            EnvStepError: for a task without a usable ``workspace``, with malformed test fields, naming an ``image``
                under the sandbox backend, without one under a container backend whose config names none, or whose
                image the container backend cannot run (not present locally, no daemon answering).
        """
        source = request.get("workspace")
        if not isinstance(source, str | os.PathLike) or not os.fspath(source).strip():
            raise EnvStepError(
                "a workspace task needs 'workspace': a folder or an archive (.tar, .tar.gz, .tgz, .zip) holding "
                "the code base"
            )
        try:
            tests = TestSpec.from_task(request, default_timeout_s=self.workspaces.config.test_timeout_s)
        except ConfigError as exc:
            raise EnvStepError(str(exc)) from None
        if tests is None:  # refused here, not after the episode (where a reward error would be retried)
            raise EnvStepError(
                "a workspace task needs its tests: 'test_command' (a shell command, exit status 0 = pass) or "
                "'fail_to_pass' / 'pass_to_pass' (pytest node ids)"
            )
        sample = await super().reset(request)
        try:
            key = await anyio.to_thread.run_sync(self.workspaces.register, sample.id, source, request.get("image"))
        except ConfigError as exc:
            raise EnvStepError(str(exc)) from None
        except BaseException:  # cancelled (past env_timeout_s) once the thread had registered it: no close follows
            self.workspaces.release(sample.id, ENVIRONMENT_HOLDER)
            raise
        sample.task = {**sample.task, "workspace_session": key}
        return sample

    def _live(self, sample: Sample) -> None:
        if self.workspaces.info(sample.id) is None:  # else a tool call would start an empty workspace for it
            raise EnvStepError(
                f"trajectory {sample.id!r} has no workspace: it was closed, or the sample did not come from this "
                "environment's reset"
            )

    async def step(self, sample: Sample) -> StepResult:
        """`ToolEnvironment.step`; its info also says whether the workspace is an overlay (``workspace_overlay``:
        1, 0 for a copy) once the workspace runs.

        Raises:
            EnvStepError: for a sample that was closed or did not come from this environment's `reset`.
        """
        self._live(sample)
        result = await super().step(sample)
        info = self.workspaces.info(sample.id)
        if info is not None and info.overlay is not None:
            result.info["workspace_overlay"] = int(info.overlay)
        return result

    async def call_tool(self, sample: Sample, name: str, arguments: str | Mapping[str, Any] | None) -> ToolReply:
        """`ToolEnvironment.call_tool` in the trajectory's workspace.

        Raises:
            EnvStepError: for a sample that was closed or did not come from this environment's `reset`.
        """
        self._live(sample)
        return await super().call_tool(sample, name, arguments)

    async def close(self, sample: Sample) -> None:
        """Ends the tools' sessions, then lets the workspace go: its processes, folder and uid are removed."""
        try:
            await super().close(sample)
        finally:
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_TIMEOUT_S):
                    await anyio.to_thread.run_sync(
                        self.workspaces.release, sample.id, ENVIRONMENT_HOLDER, abandon_on_cancel=True
                    )
            except Exception:
                logger.exception("removing the workspace of trajectory %s failed", sample.id)

    async def aclose(self) -> None:
        """Closes the tools, then removes every workspace and the run's folder."""
        await super().aclose()
        with anyio.CancelScope(shield=True), anyio.move_on_after(_RELEASE_TIMEOUT_S):
            await anyio.to_thread.run_sync(self.workspaces.close, abandon_on_cancel=True)
