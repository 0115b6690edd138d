"""`Shaping`: the weighted terms that turn a finished trajectory's facts into its reward and its turns' rewards, with
the numbers the harness has always written (`trajectory_reward = answer + tool-call share - penalty`, each step its
environment reward, milestones and share, the last step the answer less the penalty)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentic_rl.errors import EnvStepError
from agentic_rl.rewards.shaping import (
    AnswerTerm,
    EnvironmentTerm,
    MilestoneTerm,
    Shaping,
    Term,
    TermScore,
    ToolCallTerm,
    TrajectoryFacts,
    TurnFacts,
    UnfinishedTerm,
)
from agentic_rl.rollout.spec import HarnessConfig
from agentic_rl.types import Step

W = 0.1


def _facts(**overrides: Any) -> TrajectoryFacts:
    """Three turns: two well-formed calls of three attempted, an environment reward on the first turn."""
    turns = [
        TurnFacts(env_reward=0.25, well_formed_calls=1, action='<tool_call>{"name": "c"}</tool_call>'),
        TurnFacts(well_formed_calls=0),
        TurnFacts(well_formed_calls=1),
    ]
    fields: dict[str, Any] = {"turns": turns, "answer_reward": 1.0, "tool_calls": 3, "well_formed_calls": 2}
    return TrajectoryFacts(**{**fields, **overrides})


def test_the_harness_shaping_gives_the_numbers_of_its_formulas_exactly():
    shaping = Shaping.of(toolcall_weight=W, unfinished_penalty=0.5)
    done = shaping.score(_facts())
    assert done.trajectory_reward == 1.0 + W * 2 / 3
    assert done.turn_rewards == [0.25 + W * 1 / 3, W * 0 / 3, W * 1 / 3 + 1.0]
    assert done.metrics == {"res_reward": 1.0, "toolcall_reward": W * 2 / 3}
    cut = shaping.score(_facts(cut_by_limit=True))
    assert cut.trajectory_reward == 1.0 + W * 2 / 3 - 0.5
    assert cut.turn_rewards[-1] == W * 1 / 3 + (1.0 - 0.5)
    assert cut.metrics["unfinished_penalty"] == 0.5
    # without per-turn environment rewards the turns add up to the trajectory's reward
    plain = shaping.score(_facts(turns=[dataclasses.replace(t, env_reward=0.0) for t in _facts().turns]))
    assert sum(plain.turn_rewards) == pytest.approx(plain.trajectory_reward, abs=1e-12)


def test_a_failed_trajectory_keeps_only_its_per_turn_environment_and_milestone_rewards():
    shaping = Shaping.of(toolcall_weight=W, milestone_weight=0.4, unfinished_penalty=0.5)
    turns = [TurnFacts(env_reward=0.25, well_formed_calls=1, tool_results=("it is 84",)), TurnFacts()]
    failed = shaping.score(TrajectoryFacts(turns, failed=True, cut_by_limit=True, tool_calls=1, milestones=["84"]))
    assert failed.trajectory_reward == 0.0
    assert failed.turn_rewards == [0.25 + 0.4, 0.0]
    assert failed.metrics == {"res_reward": 0.0, "toolcall_reward": 0.0}  # no penalty on a failed one


def test_milestones_credit_the_turn_that_first_shows_them_not_an_echo_of_its_own_call():
    shaping = Shaping.of(toolcall_weight=0.0, milestone_weight=0.6)
    echo = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "84 + 0"}}\n</tool_call>'
    turns = [
        TurnFacts(action=echo, tool_results=("84",)),  # the calculator echoes what the call wrote
        TurnFacts(tool_results=("Paris has 84 museums",)),  # first shows 84, and Paris
        TurnFacts(tool_results=("Paris, again",)),
    ]
    shaped = shaping.score(TrajectoryFacts(turns, milestones=["84", "Paris", "Lyon"]))
    assert shaped.turn_rewards == [0.0, 0.6 * 2 / 3, 0.0]
    assert shaped.trajectory_reward == 0.0  # milestones reward steps only


def test_a_term_of_weight_zero_is_a_metric_and_terms_may_be_ones_own():
    @dataclasses.dataclass(frozen=True)
    class Turns:
        weight: float = 0.0
        name: str = "turns"

        def score(self, facts: TrajectoryFacts) -> TermScore:
            value = self.weight * len(facts.turns)
            return TermScore(trajectory=value, last=value, metrics={"turns": float(len(facts.turns))})

    assert isinstance(Turns(), Term)
    base = Shaping((EnvironmentTerm(), AnswerTerm(), ToolCallTerm(W)))
    with_metric = Shaping((*base.terms, Turns()))
    assert with_metric.score(_facts()).trajectory_reward == base.score(_facts()).trajectory_reward
    assert with_metric.score(_facts()).turn_rewards == base.score(_facts()).turn_rewards
    assert with_metric.score(_facts()).metrics["turns"] == 3.0
    weighted = Shaping((*base.terms, Turns(weight=0.5))).score(_facts())
    assert weighted.trajectory_reward == base.score(_facts()).trajectory_reward + 1.5
    assert weighted.turn_rewards[-1] == W * 1 / 3 + (1.0 + 1.5)  # the last turn gets every last-turn part
    assert ToolCallTerm(0.0).score(_facts()).metrics == {"toolcall_reward": 0.0}


def test_the_harness_config_builds_its_shaping_and_milestones_are_checked_only_when_weighed():
    assert HarnessConfig().shaping() == Shaping.of(toolcall_weight=0.1)
    config = HarnessConfig(toolcall_weight=0.2, milestone_weight=0.3, unfinished_penalty=0.4)
    assert config.shaping().terms == (
        EnvironmentTerm(),
        MilestoneTerm(0.3),
        AnswerTerm(),
        ToolCallTerm(0.2),
        UnfinishedTerm(0.4),
    )
    assert HarnessConfig().shaping().milestones({"milestones": "not a list"}) == []
    assert config.shaping().milestones({"milestones": ["a", " a ", "b"]}) == ["a", "b"]
    with pytest.raises(EnvStepError, match="milestones"):
        config.shaping().milestones({"milestones": "not a list"})


def test_turn_facts_of_a_step_and_credit_into_steps():
    facts = TurnFacts.of({"reward": 0.5, "well_formed_calls": 2}, 3, None, [{"content": "x"}, {"content": None}])
    assert facts == TurnFacts(env_reward=0.5, well_formed_calls=2, action="", tool_results=("x", ""))
    with pytest.raises(EnvStepError, match="turn 3: step"):
        TurnFacts.of({"reward": float("nan")}, 3, "")
    shaped = Shaping.of(toolcall_weight=W).score(_facts())
    steps = [Step(chat_completions=[]) for _ in range(3)]
    shaped.credit(steps)
    assert [s.reward for s in steps] == shaped.turn_rewards
    with pytest.raises(ValueError):
        shaped.credit(steps[:2])
