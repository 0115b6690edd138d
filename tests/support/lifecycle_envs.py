"""Environments that fail at the edges of a run's life, for the set-up and teardown tests: one whose constructor
raises (built after the engine started), one whose `aclose` raises, one whose `aclose` never returns."""

from __future__ import annotations

import anyio

from agentic_rl.environments.tool_env import ToolEnvironment


class FailsToBuild(ToolEnvironment):
    """Its constructor raises: a run fails after its engine started, while building its rollout."""

    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("FailsToBuild cannot be built")


class FailsToClose(ToolEnvironment):
    """A working tool environment whose `aclose` raises once the run is over."""

    async def aclose(self) -> None:
        await super().aclose()
        raise RuntimeError("FailsToClose cannot close")


class NeverCloses(ToolEnvironment):
    """A working tool environment whose `aclose` waits forever."""

    async def aclose(self) -> None:
        await anyio.sleep_forever()
