"""An environment of your own under the harness: the environment contract (`StepResult.of`: tuples, string and
None observations) and `examples/guess_game.py`'s game, driven by a scripted engine through the real chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.engines import ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.errors import EnvStepError
from agentic_rl.plugins import load_object
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def guess_game(monkeypatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT))
    return load_object("examples.guess_game:GuessEnvironment", what="environment", base=Environment)


@pytest.mark.parametrize(("value", "expected"), [
    (([{"role": "tool", "content": "7"}], False, {"n": 1}), ([{"role": "tool", "content": "7"}], False, {"n": 1})),
    (("lower", False, {}), ([{"role": "tool", "content": "lower"}], False, {})),
    ((None, True, {}), ([], True, {})),
    (({"role": "user", "content": "again"}, False), ([{"role": "user", "content": "again"}], False, {})),
    ((None, False, None), ([], False, {})),
    (StepResult([{"role": "tool", "content": "x"}], True, {"k": 2}), ([{"role": "tool", "content": "x"}], True, {"k": 2})),
])  # fmt: skip
def test_step_results_in_every_documented_shape(value, expected):
    assert tuple(StepResult.of(value)) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("done", "must return \\(observation, done, info\\) or a StepResult, got str"),
    ((None, 1, {}), "done must be a bool, got int"),
    ((None, False, []), "info must be a dict, got list"),
    ((42, False, {}), "an observation must be None, a string, a message dict or a list of them, got int"),
    (([{"content": "no role"}], False, {}), "must be a dict with a 'role'"),
    (([{"role": "tool", "content": 3}], False, {}), "content must be a string"),
])  # fmt: skip
def test_malformed_step_results_are_named(value, message):
    with pytest.raises(EnvStepError, match=message):
        StepResult.of(value)


def _script(question: str, turn: int) -> str:
    """Guess 8, then 4, then answer 4 (whatever the tool said)."""
    return ['<tool_call>\n{"name": "guess", "arguments": {"number": 8}}\n</tool_call>',
            '<tool_call>\n{"name": "guess", "arguments": {"number": 4}}\n</tool_call>', "It is 4."][turn]  # fmt: skip


def _expected_answers(secret: int) -> list[str]:
    return ["correct" if g == secret else "higher" if g < secret else "lower" for g in (8, 4)]


async def test_guess_game_keeps_one_game_per_trajectory_under_the_harness(tokenizer, guess_game):
    secrets = [4, 8, 11, 1, 4, 16, 2, 9]
    env = guess_game(low=1, high=16)
    spec = RolloutSpec(ScriptedEngine(tokenizer, _script), env, ChatRenderer(tokenizer),
                       HarnessConfig(max_steps=3, max_prompt_length=1024, max_response_length=512),
                       reward_fn=gsm8k_reward)  # fmt: skip
    tasks = [{"id": f"g{i}", "question": "find it", "ground_truth": str(s)} for i, s in enumerate(secrets)]
    trajectories = (await Rollout(spec, n_parallel_agents=8).run(tasks)).trajectories
    for t, secret in zip(trajectories, secrets, strict=True):
        assert not t.failed, t.error
        tool_answers = [m["content"] for m in t.chat_completions if m["role"] == "tool"]
        assert tool_answers == _expected_answers(secret)  # each trajectory saw its own game, not a sibling's
        assert t.chat_completions[1]["content"] == "I am thinking of a whole number from 1 to 16. Find it."
        assert t.task["question"] == t.chat_completions[1]["content"]  # reset replaced the request's question
        assert t.trajectory_reward == (1.0 if secret == 4 else 0.0) + 0.1  # the answer and well-formed calls
        # each call turn is credited half the tool-call reward, the answer turn the answer's reward
        assert [s.reward for s in t.steps] == [0.05, 0.05, 1.0 if secret == 4 else 0.0]
        assert sum(s.reward for s in t.steps) == pytest.approx(t.trajectory_reward)
        assert t.termination_reason == "env_done" and t.metrics["tool_calls"] == 2
        assert t.metrics["alignment_mismatches"] == 0  # string observations render token-exactly
    assert env.tool._games == {}  # close ended every game


async def test_guess_game_close_is_idempotent_and_never_raises(guess_game):
    env = guess_game()
    sample = await env.reset({"id": 1, "question": "q", "ground_truth": "3", "trajectory_id": "1-0"})
    await env.close(sample)
    await env.close(sample)
    await env.close(Sample(id="never-opened", task={}))


async def test_a_none_observation_appends_no_message(tokenizer):
    """An environment that answers a turn with None: the model's next turn follows its last one directly."""

    class TwoAnswers(Environment):
        async def reset(self, request: dict[str, Any]) -> Sample:
            return Sample(id=request["trajectory_id"], task=request,
                          messages=[{"role": "user", "content": request["question"]}])  # fmt: skip

        async def step(self, sample: Sample) -> tuple[Any, bool, dict[str, Any]]:
            return None, sum(m["role"] == "assistant" for m in sample.messages) >= 2, {}

    spec = RolloutSpec(ScriptedEngine(tokenizer, lambda q, turn: f"answer {turn}"), TwoAnswers(), ChatRenderer(tokenizer),
                       HarnessConfig(max_steps=3, max_prompt_length=1024, max_response_length=512))  # fmt: skip
    (t,) = (await Rollout(spec, n_parallel_agents=1).run([{"id": 0, "question": "say", "ground_truth": "0"}])).trajectories
    assert not t.failed, t.error
    assert [m["role"] for m in t.chat_completions] == ["user", "assistant", "assistant"]
    assert t.metrics["alignment_mismatches"] == 0
    assert t.termination_reason == "env_done"


def test_guess_game_refuses_an_empty_range(guess_game):
    with pytest.raises(ValueError, match="low must be below high"):
        guess_game(low=5, high=5)


async def test_a_reset_that_returns_no_sample_fails_its_trajectory_only(tokenizer):
    class Sloppy(Environment):
        async def reset(self, request: dict[str, Any]) -> Any:
            if request["id"] == 1:
                return {"messages": []}  # a dict, not a Sample
            return Sample(id=request["trajectory_id"], task=request,
                          messages=[{"role": "user", "content": request["question"]}])  # fmt: skip

        async def step(self, sample: Sample) -> tuple[Any, bool, dict[str, Any]]:
            return None, True, {}

    spec = RolloutSpec(ScriptedEngine(tokenizer, lambda q, turn: "done"), Sloppy(), ChatRenderer(tokenizer),
                       HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=512))  # fmt: skip
    tasks = [{"id": i, "question": "say", "ground_truth": "0"} for i in range(3)]
    out = (await Rollout(spec, n_parallel_agents=3).run(tasks)).trajectories
    assert [t.failed for t in out] == [False, True, False]
    assert out[1].error == "EnvStepError: reset() must return a Sample, got dict"
