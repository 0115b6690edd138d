"""The environment contract: `reset(request) -> sample`, `step(sample) -> (observation, done, info)`, `close`.

- `reset(request)` sets up one trajectory and may augment or replace the request: the `Sample` it returns holds
  the task the reward is computed on (`sample.task`), the first messages and the tool schemas.
- `step(sample)` reacts to the latest assistant message: it returns a `StepResult` or a plain
  `(observation, done, info)` tuple. The observation is a list of messages, one message dict, a string (one `tool`
  message) or None (no message: the model's next turn follows its last one directly). The environment, not the
  harness, decides when the trajectory is done.
- `close(sample)` is optional, idempotent and must not raise; the harness calls it once per trajectory, also after
  a failure.

One environment instance serves many concurrent trajectories, so per-trajectory state lives in the `Sample` (or
is keyed by `sample.id`), never on the environment itself.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import EnvStepError

__all__ = ["INFRASTRUCTURE_ERRORS_KEY", "Environment", "Sample", "StepResult"]


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


INFRASTRUCTURE_ERRORS_KEY = "infrastructure_errors"
"""`StepResult.info` key: a list of messages, one per tool call of the turn whose service failed (transport error,
timeout, start-up, a crash) rather than the call. The turn loop then ends the trajectory as an infrastructure failure
(`types.FailureKind.TOOL`: retried, never trained); the observation is kept in its messages, for the record."""


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

    @classmethod
    def of(cls, value: Any) -> StepResult:
        """What `Environment.step` returned, as a `StepResult`: a `StepResult`, or an `(observation, done, info)` /
        `(observation, done)` tuple whose observation is a list of messages, one message dict, a string (one `tool`
        message) or None (no message).

        Raises:
            EnvStepError: naming what is wrong with the value.
        """
        if isinstance(value, StepResult):
            observation, done, info = value.observation, value.done, value.info
        elif isinstance(value, tuple) and len(value) in (2, 3):
            observation, done, info = (*value, {}) if len(value) == 2 else value
        else:
            raise EnvStepError(
                f"step() must return (observation, done, info) or a StepResult, got {type(value).__name__}"
            )
        if not isinstance(done, bool):
            raise EnvStepError(f"step()'s done must be a bool, got {type(done).__name__}")
        if info is None:
            info = {}
        if not isinstance(info, dict):
            raise EnvStepError(f"step()'s info must be a dict, got {type(info).__name__}")
        return cls(_messages(observation), done, info)


def _messages(observation: Any) -> list[dict[str, Any]]:
    """An observation as a list of messages (see `StepResult.of`)."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": "tool", "content": observation}]
    if isinstance(observation, dict):
        observation = [observation]
    if not isinstance(observation, list):
        raise EnvStepError(
            f"an observation must be None, a string, a message dict or a list of them, got {type(observation).__name__}"
        )
    for message in observation:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise EnvStepError(f"an observation message must be a dict with a 'role', got {message!r:.80}")
        if not isinstance(message.get("content", ""), str):
            raise EnvStepError(f"an observation message's content must be a string, got {message!r:.80}")
    return observation


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
    async def step(self, sample: Sample) -> StepResult | tuple[Any, bool, dict[str, Any]]:
        """React to the latest assistant message in `sample.messages`.

        Returns:
            `(observation, done, info)` or a `StepResult`: what to append (a list of messages such as tool results,
            one message, a string for one `tool` message, or None for nothing), whether the trajectory ended, and
            details such as tool-call counts (numbers under `tool_calls`, `tool_errors`, `well_formed_calls` are
            summed into the trajectory's metrics). `info["reward"]`, when given, is this turn's own reward: a finite
            number added to the turn's `Step.reward` (not to `trajectory_reward`); anything else fails the
            trajectory with an `EnvStepError` naming the turn.
        """

    async def close(self, sample: Sample) -> None:  # noqa: B027  (optional hook)
        """Free what `reset` or `step` allocated for `sample`. Optional, idempotent, and must not raise."""

    async def aclose(self) -> None:  # noqa: B027  (optional hook)
        """Free what the environment holds across trajectories (tool clients, pools), when its owner is done with
        it. Optional; must not raise."""
