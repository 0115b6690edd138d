"""The environment contract: `reset(request) -> sample`, `step(sample) -> (observation, done, info)`, `close`.

One environment instance serves many concurrent trajectories, so per-trajectory state lives in the `Sample` (or
is keyed by `sample.id`), never on the environment itself.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Environment", "Sample", "StepResult"]


@dataclass(slots=True)
class Sample:
    """The state of one trajectory that the harness and the environment share.

    Attributes:
        id: unique id of the trajectory (used to key per-trajectory state such as tool sessions).
        task: the task this trajectory solves (`{"id", "question", "ground_truth", ...}`).
        messages: the conversation so far as `{"role", "content"}` dicts; the harness appends each assistant
            message before calling `step`.
        tools: OpenAI function schemas offered to the model (rendered into the prompt), or [].
        state: free-form per-trajectory state owned by the environment.
    """

    id: str
    task: dict[str, Any]
    messages: list[dict[str, str]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class StepResult:
    """What `Environment.step` returns: new messages for the model, whether the episode ended, and details.

    Unpacks as `(observation, done, info)`.
    """

    observation: list[dict[str, str]]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter((self.observation, self.done, self.info))


class Environment(abc.ABC):
    """Base class of environments. The environment, not the harness, decides when a trajectory is done."""

    @abc.abstractmethod
    async def reset(self, request: dict[str, Any]) -> Sample:
        """Start a trajectory for `request` (a task dict with at least `id` and `question`).

        Returns:
            The sample with the initial messages (system prompt, user question) and tool schemas.

        Raises:
            EnvStepError: if the request cannot start a trajectory.
        """

    @abc.abstractmethod
    async def step(self, sample: Sample) -> StepResult:
        """React to the latest assistant message in `sample.messages`.

        Returns:
            `(observation, done, info)`: the messages to append (tool results), whether the trajectory ended, and
            details such as tool-call counts.
        """

    async def close(self, sample: Sample) -> None:  # noqa: B027  (optional hook)
        """Free what `reset` or `step` allocated for `sample`. Optional, idempotent, and must not raise."""

    async def aclose(self) -> None:  # noqa: B027  (optional hook)
        """Free what the environment holds across trajectories (tool clients, pools), when its owner is done with
        it. Optional; must not raise."""
