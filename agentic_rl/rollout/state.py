"""What one trajectory has done so far (`TrajectoryState`), and the checkpoint of one stopped at a turn boundary
(`TrajectoryCheckpoint`): shared by the trajectory's lifecycle (`rollout.harness`) and its turn loop
(`rollout.turn_loop`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentic_rl.chat import Segment
from agentic_rl.environments.base import Sample
from agentic_rl.memory import MemorySimple
from agentic_rl.rewards.shaping import TurnFacts
from agentic_rl.types import RunRecorder, Step, TokenRun

__all__ = ["TrajectoryCheckpoint", "TrajectoryState"]


@dataclass(slots=True)
class TrajectoryState:
    """Everything one trajectory has done so far: what a `TrajectoryCheckpoint` holds."""

    task: dict[str, Any]
    idx: int
    sample: Sample | None = None
    steps: list[Step] = field(default_factory=list)
    metrics: dict[str, Any] = field(
        default_factory=lambda: {
            "llm_time": 0.0,
            "env_time": 0.0,
            "reward_time": 0.0,
            "tool_calls": 0,
            "tool_errors": 0,
            "well_formed_calls": 0,
        }
    )
    recorder: RunRecorder = field(default_factory=RunRecorder)
    messages: list[dict[str, Any]] = field(default_factory=list)  # what the current run renders
    segments: list[Segment] = field(default_factory=list)  # the current run, one segment per append (alignment check)
    memory: MemorySimple | None = None
    turn: int = 0  # the next turn to generate
    observation: Any = None  # what the model saw last
    elapsed_s: float = 0.0
    milestones: list[str] = field(default_factory=list)  # the task's, validated once when it starts
    turn_facts: dict[int, TurnFacts] = field(default_factory=dict)  # by step: what shaping reads of each turn
    budget_offset: int = 0  # response-budget tokens the current run's prompt holds (a run a template rewrite began)
    attempt: int = 0  # 0, then 1, 2, ... for each retry after an infrastructure failure (`run_trajectory`)
    retries: dict[str, int] = field(default_factory=dict)  # retries so far, by `FailureKind`
    retried_s: float = 0.0  # wall-clock seconds of the failed attempts before this one
    retried_tokens: int = 0  # tokens the engine sampled in the failed attempts before this one


@dataclass(slots=True)
class TrajectoryCheckpoint:
    """An unfinished trajectory stopped at a turn boundary (before a generation), ready to be resumed.

    The environment is **not** closed: `sample` is the live handle of its per-trajectory state (tool sessions,
    sandbox processes stay open), so a checkpoint can be resumed only in the same process, with the same
    environment object; `Rollout.discard` closes the environments of checkpoints that will not be resumed.
    Resuming continues with turn `turn` on exactly the recorded token ids (nothing is re-rendered or re-sampled).
    """

    _state: TrajectoryState

    @property
    def task(self) -> dict[str, Any]:
        """The validated task."""
        return self._state.task

    @property
    def idx(self) -> int:
        """The task's position in the batch (also offsets the sampling seed)."""
        return self._state.idx

    @property
    def sample(self) -> Sample:
        """The environment's live state of this trajectory."""
        assert self._state.sample is not None
        return self._state.sample

    @property
    def turn(self) -> int:
        """Index of the next turn to generate (0 = suspended after `reset`, before any generation)."""
        return self._state.turn

    @property
    def steps(self) -> list[Step]:
        """The `Step` of each turn generated so far."""
        return self._state.steps

    @property
    def metrics(self) -> dict[str, Any]:
        """The trajectory's metrics so far (times, tool-call counts)."""
        return self._state.metrics

    @property
    def elapsed_s(self) -> float:
        """Wall-clock seconds the trajectory ran before it was suspended."""
        return self._state.elapsed_s

    @property
    def runs(self) -> list[TokenRun]:
        """The token runs recorded so far."""
        return self._state.recorder.runs

    @property
    def prompt_ids(self) -> list[int]:
        """The first prompt of the current exact run (token ids)."""
        return list(self._state.recorder.current.prompt_ids) if self.runs else []

    @property
    def response_ids(self) -> list[int]:
        """Everything after `prompt_ids` so far: sampled and inserted token ids."""
        return list(self._state.recorder.current.response_ids) if self.runs else []

    @property
    def weight_versions(self) -> list[int]:
        """The engine weight version of each generated turn, in order."""
        return [int(step.info.get("weight_version", 0)) for step in self.steps]
