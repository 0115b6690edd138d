"""Reward shaping: one weighted rubric that turns a finished trajectory's facts into its `trajectory_reward` and the
reward of each of its turns (`Step.reward`).

A `Shaping` is a list of terms. Each term scores the facts (`TrajectoryFacts`) with its weight already applied, in
three parts: what it adds to `trajectory_reward`, what it credits to each turn, and what it credits to the last turn
(`TermScore`); it may report metrics beside them. A term of weight 0 adds nothing: it is a metric. The harness's
shaping (`Shaping.of`, from `HarnessConfig`) has these terms, in this order:

- `EnvironmentTerm` (weight 1): each turn's own reward from the environment (`info["reward"]` of the `step()` that
  reacted to it); per turn only.
- `MilestoneTerm` (`milestone_weight`, present only when it is not 0): `milestone_weight / len(milestones)` for each
  of the task's `milestones` that a turn's tool results first show (`turns.milestone_reward`); per turn only, a
  process reward for step-level training (`GRPOConfig.advantage = "step"`).
- `AnswerTerm` (weight 1): the final answer's reward (`reward_fn`; 0 for a failed trajectory), on the trajectory and
  the last turn; metric `res_reward`.
- `ToolCallTerm` (`toolcall_weight`): `toolcall_weight * well-formed calls / attempted calls` on the trajectory, each
  turn getting the part its own well-formed calls earn; 0 for a failed trajectory; metric `toolcall_reward`.
- `UnfinishedTerm` (`unfinished_penalty`): minus the penalty, on the trajectory and the last turn, when a limit cut a
  trajectory that did not fail; metric `unfinished_penalty` when applied.

`trajectory_reward` is the sum of the terms' trajectory parts; a turn's reward is the sum of the terms' parts for
it, and on the last turn the sum of their last-turn parts. The step rewards therefore add up to `trajectory_reward`
(up to float rounding) whenever the environment gives no per-turn reward of its own and no milestone is set;
per-turn environment and milestone rewards go to the steps only, never to `trajectory_reward`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentic_rl.rewards.turns import environment_turn_reward, milestone_reward, task_milestones
from agentic_rl.types import Step

__all__ = [
    "AnswerTerm",
    "EnvironmentTerm",
    "MilestoneTerm",
    "Shaped",
    "Shaping",
    "Term",
    "TermScore",
    "ToolCallTerm",
    "TrajectoryFacts",
    "TurnFacts",
    "UnfinishedTerm",
]


@dataclass(frozen=True, slots=True)
class TurnFacts:
    """What one turn did, as shaping reads it. A turn the environment did not react to (the last turn of a
    trajectory cut while generating) is `TurnFacts()`.

    Attributes:
        env_reward: the environment's own reward for the turn (a finite number, checked when the turn ran).
        well_formed_calls: the turn's well-formed tool calls (its `info["well_formed_calls"]`).
        action: the turn's tool-call text (`Step.action`).
        tool_results: the text of each tool result the environment answered the turn with.
    """

    env_reward: float = 0.0
    well_formed_calls: int = 0
    action: str = ""
    tool_results: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, info: Mapping[str, Any], turn: int, action: str | None, tool_results: Sequence[Mapping[str, Any]] = ()
    ) -> TurnFacts:
        """Turn `turn`'s facts from its environment step's `info` (`info["reward"]`, `info["well_formed_calls"]`),
        its action and the tool-result messages that answered it (their `content`).

        Raises:
            EnvStepError: naming the turn, if `info["reward"]` is not a finite number (`environment_turn_reward`).
        """
        texts = tuple(str(message.get("content") or "") for message in tool_results)
        return cls(environment_turn_reward(info, turn), int(info.get("well_formed_calls", 0)), action or "", texts)


@dataclass(frozen=True, slots=True)
class TrajectoryFacts:
    """What a finished trajectory did, as shaping reads it.

    Attributes:
        turns: one `TurnFacts` per turn (`Step`), in order.
        answer_reward: the final answer's reward (`reward_fn`; 0 for a failed trajectory or without one).
        failed: whether the trajectory failed.
        cut_by_limit: whether a limit cut it before the environment ended it (`TerminationReason.cut_by_limit`).
        tool_calls: the tool calls it attempted.
        well_formed_calls: those that were well formed.
        milestones: the task's milestones (`turns.task_milestones`); () without them.
    """

    turns: Sequence[TurnFacts] = ()
    answer_reward: float = 0.0
    failed: bool = False
    cut_by_limit: bool = False
    tool_calls: int = 0
    well_formed_calls: int = 0
    milestones: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class TermScore:
    """One term's weighted score of a trajectory.

    Attributes:
        trajectory: added to `trajectory_reward`.
        turns: added to each turn's reward, one value per turn (empty: nothing per turn).
        last: added to the last turn's reward.
        metrics: reported beside the rewards (metric name -> number).
    """

    trajectory: float = 0.0
    turns: tuple[float, ...] = ()
    last: float = 0.0
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Term(Protocol):
    """A weighted part of the reward: `score(facts)` with `weight` applied (weight 0: a metric only)."""

    name: str
    weight: float

    def score(self, facts: TrajectoryFacts) -> TermScore: ...


@dataclass(frozen=True, slots=True)
class EnvironmentTerm:
    """The environment's own reward of each turn (`TurnFacts.env_reward`), times `weight`; per turn only."""

    weight: float = 1.0
    name: str = "environment"

    def score(self, facts: TrajectoryFacts) -> TermScore:
        return TermScore(turns=tuple(self.weight * turn.env_reward for turn in facts.turns))


@dataclass(frozen=True, slots=True)
class MilestoneTerm:
    """`weight / len(milestones)` to the turn whose tool results first show each milestone (`milestone_reward`: a
    whole-word occurrence, not an echo of the turn's own call); per turn only, also for a failed trajectory."""

    weight: float
    name: str = "milestones"

    def score(self, facts: TrajectoryFacts) -> TermScore:
        reached: set[str] = set()
        shares = (
            milestone_reward(facts.milestones, reached, turn.tool_results, self.weight, action=turn.action)
            for turn in facts.turns
        )
        return TermScore(turns=tuple(shares))


@dataclass(frozen=True, slots=True)
class AnswerTerm:
    """The final answer's reward times `weight`, on the trajectory and its last turn (metric `res_reward`: the
    reward as `reward_fn` gave it)."""

    weight: float = 1.0
    name: str = "answer"

    def score(self, facts: TrajectoryFacts) -> TermScore:
        value = self.weight * facts.answer_reward
        return TermScore(trajectory=value, last=value, metrics={"res_reward": facts.answer_reward})


@dataclass(frozen=True, slots=True)
class ToolCallTerm:
    """`weight * well-formed calls / attempted calls` on the trajectory (0 without calls or when it failed); each
    turn gets `weight * its well-formed calls / attempted calls`, so the turns' parts add up to it (metric
    `toolcall_reward`)."""

    weight: float
    name: str = "toolcall"

    def score(self, facts: TrajectoryFacts) -> TermScore:
        attempted = facts.tool_calls
        if not attempted:
            return TermScore(metrics={"toolcall_reward": 0.0})
        weight = 0.0 if facts.failed else self.weight
        value = weight * facts.well_formed_calls / attempted
        shares = tuple(weight * turn.well_formed_calls / attempted for turn in facts.turns)
        return TermScore(trajectory=value, turns=shares, metrics={"toolcall_reward": value})


@dataclass(frozen=True, slots=True)
class UnfinishedTerm:
    """Minus `weight` on the trajectory and its last turn when a limit cut it and it did not fail (metric
    `unfinished_penalty`: the penalty, when applied)."""

    weight: float
    name: str = "unfinished"

    def score(self, facts: TrajectoryFacts) -> TermScore:
        penalty = self.weight if not facts.failed and facts.cut_by_limit else 0.0
        return TermScore(trajectory=-penalty, last=-penalty, metrics={"unfinished_penalty": penalty} if penalty else {})


@dataclass(frozen=True, slots=True)
class Shaped:
    """A trajectory's shaped rewards.

    Attributes:
        trajectory_reward: the sum of the terms' trajectory parts.
        turn_rewards: each turn's reward, one per `TrajectoryFacts.turns`.
        metrics: every term's metrics, in term order.
    """

    trajectory_reward: float
    turn_rewards: list[float]
    metrics: dict[str, float]

    def credit(self, steps: Sequence[Step]) -> None:
        """Write each turn's reward into its `Step.reward` (in place).

        Raises:
            ValueError: if `steps` are not as many as the turns.
        """
        for step, value in zip(steps, self.turn_rewards, strict=True):
            step.reward = value


@dataclass(frozen=True, slots=True)
class Shaping:
    """A weighted list of terms (see the module's docstring) that scores finished trajectories.

    Attributes:
        terms: the terms, summed in this order.
    """

    terms: tuple[Term, ...]

    @classmethod
    def of(cls, *, toolcall_weight: float, milestone_weight: float = 0.0, unfinished_penalty: float = 0.0) -> Shaping:
        """The harness's shaping: the environment's turn rewards, milestones (when `milestone_weight` is not 0),
        the answer, the tool-call share and the unfinished penalty (`HarnessConfig`'s weights)."""
        milestones = (MilestoneTerm(milestone_weight),) if milestone_weight else ()
        return cls(
            (
                EnvironmentTerm(),
                *milestones,
                AnswerTerm(),
                ToolCallTerm(toolcall_weight),
                UnfinishedTerm(unfinished_penalty),
            )
        )

    def milestones(self, task: Mapping[str, Any]) -> list[str]:
        """The task's milestones when a milestone term weighs them, else [] (a task's list is checked only then).

        Raises:
            EnvStepError: if the task's `milestones` is not a list of non-empty strings.
        """
        if not any(isinstance(term, MilestoneTerm) and term.weight for term in self.terms):
            return []
        return task_milestones(task)

    def score(self, facts: TrajectoryFacts) -> Shaped:
        """The trajectory's reward, its turns' rewards and the terms' metrics."""
        trajectory, last = 0.0, 0.0
        turns = [0.0] * len(facts.turns)
        metrics: dict[str, float] = {}
        for term in self.terms:
            scored = term.score(facts)
            trajectory += scored.trajectory
            last += scored.last
            for k, value in enumerate(scored.turns):
                turns[k] += value
            metrics.update(scored.metrics)
        if turns:
            turns[-1] += last
        return Shaped(trajectory, turns, metrics)
