"""The rollout limits and their ranges, as the AgentSDK API gives them: defined once, used by every settings object.

Each limit is an `Annotated` int type for pydantic fields where a user's settings enter (`BaseEngineWrapper`'s
checks, the training config's rollout section, `MemoryConfig`); `bounds` reads a limit's range back (the command
line's checks, error messages), so a range is written in one place only. The turn loop itself (`HarnessConfig`)
takes any positive value (`AtLeastOne`): benchmarks and harness-level users drive 100+ turns.

| limit | range | meaning |
|---|---|---|
| `max_steps` | [1, 10] | most assistant turns per trajectory |
| `max_prompt_length` | [1, 131072] | most tokens of a first prompt |
| `max_response_length` | [1, 8192] | most tokens after the first prompt (sampled + inserted), the response budget |
| `n_parallel_agents` | [1, 64] | trajectories in flight at once |
| (`AtLeastOne`) | [1, ...) | what the turn loop and the batch runner themselves accept |
"""

from __future__ import annotations

import typing
from typing import Annotated, Any

from annotated_types import Ge, Le
from pydantic import Field

__all__ = ["AtLeastOne", "MaxPromptLength", "MaxResponseLength", "MaxSteps", "NParallelAgents", "bounds", "describe"]

AtLeastOne = Annotated[int, Field(ge=1)]
MaxSteps = Annotated[int, Field(ge=1, le=10)]
MaxPromptLength = Annotated[int, Field(ge=1, le=128 * 1024)]
MaxResponseLength = Annotated[int, Field(ge=1, le=8 * 1024)]
NParallelAgents = Annotated[int, Field(ge=1, le=64)]


def bounds(limit: Any) -> tuple[int, int]:
    """`(low, high)`, inclusive, of one of the limits above (e.g. `bounds(MaxSteps) == (1, 10)`)."""
    low = high = None
    for info in typing.get_args(limit)[1:]:
        for rule in getattr(info, "metadata", ()):
            if isinstance(rule, Ge):
                low = rule.ge
            elif isinstance(rule, Le):
                high = rule.le
    if low is None or high is None:
        raise TypeError(f"{limit!r} is not one of the limits of agentic_rl.limits")
    return int(low), int(high)


def describe(limit: Any) -> str:
    """`"an int in [low, high]"` for error messages."""
    low, high = bounds(limit)
    return f"an int in [{low}, {high}]"
