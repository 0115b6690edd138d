"""A tool environment whose tool service fails one trajectory start in five (of first attempts), for the retry tests
of a training run: the failed `reset` raises `ToolUnavailableError`, as a sandbox or an MCP session that could not
start would, and each failure is logged as one line in `log` (the run is another process). (The tiny model's turns
are cut by `max_tokens`, so they never reach a tool call: the start is where the tool's service can fail.)"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from agentic_rl.environments.base import Sample
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ToolUnavailableError


class FlakyToolEnvironment(ToolEnvironment):
    """Every fifth start of a first attempt (a trajectory id without `-retry`) fails as the tool's service; a retry's
    starts never do, so every trajectory ends well whatever the order the trajectories start in."""

    def __init__(self, tools: Any = (), *, log: str, every: int = 5, **options: Any) -> None:
        super().__init__(tools, **options)
        self.log, self.every, self.starts = Path(log), every, 0
        self._count = threading.Lock()

    async def reset(self, request: dict[str, Any]) -> Sample:
        trajectory_id = str(request["trajectory_id"])
        if "-retry" not in trajectory_id:
            with self._count:
                self.starts += 1
                failing = self.starts % self.every == 0
            if failing:
                with self.log.open("a") as f:
                    f.write(trajectory_id + "\n")
                raise ToolUnavailableError("calculator service: connection refused at session start (injected)")
        return await super().reset(request)
