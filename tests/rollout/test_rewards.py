"""Reward functions: GSM8K and MATH with math-verify, HotpotQA EM/F1, resolution by name or import path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rl.errors import ConfigError, RewardError
from agentic_rl.rollout.rewards import (
    answer_f1,
    extract_gsm8k_answer,
    extract_short_answer,
    gsm8k_reward,
    hotpotqa_em_reward,
    hotpotqa_f1_reward,
    math_reward,
    normalize_answer,
    resolve_reward,
)


def _chat(answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]


def test_gsm8k_reward_reads_the_number_after_the_marker_and_strips_commas():
    task = {"ground_truth": "She sells 9 * 2 = 18\n#### 1,600"}
    assert extract_gsm8k_answer(task["ground_truth"]) == "1600"
    assert gsm8k_reward(task, _chat("So the total is 1,600 dollars.")) == 1.0
    assert gsm8k_reward(task, _chat("<think>maybe 1600</think>The answer is 1500.")) == 0.0
    assert gsm8k_reward({"ground_truth": "18"}, _chat("\\boxed{18}")) == 1.0
    with pytest.raises(RewardError, match="ground_truth"):
        gsm8k_reward({}, _chat("1"))


def test_hotpotqa_normalization_and_f1_follow_the_official_rules():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert answer_f1("the Eiffel tower", "Eiffel Tower") == (1.0, 1.0)
    em, f1 = answer_f1("Eiffel Tower in Paris", "Eiffel Tower")
    assert em == 0.0 and f1 == pytest.approx(2 * (2 / 4) * 1.0 / (2 / 4 + 1.0))
    assert answer_f1("yes", "no") == (0.0, 0.0)
    assert answer_f1("no", "no") == (1.0, 1.0)


def test_short_answer_extraction_prefers_tags_then_answer_is_then_last_line():
    assert extract_short_answer("blah <answer>Paris</answer> more") == "Paris"
    assert extract_short_answer("I searched.\nThe answer is Arthur's Magazine.\nDone") == "Arthur's Magazine."
    assert extract_short_answer("first\nlast line") == "last line"
    task = {"ground_truth": "Arthur's Magazine"}
    assert hotpotqa_em_reward(task, _chat("<answer>Arthur's Magazine</answer>")) == 1.0
    assert hotpotqa_f1_reward(task, _chat("Answer: the magazine")) == pytest.approx(2 / 3)  # P=1, R=1/2


def test_rewards_resolve_by_name_or_import_path():
    assert resolve_reward("gsm8k") is gsm8k_reward
    assert resolve_reward("agentic_rl.rollout.rewards:hotpotqa_f1_reward") is hotpotqa_f1_reward
    with pytest.raises(ConfigError, match="unknown reward"):
        resolve_reward("nope")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_reward("no_such_module:fn")


def test_math_reward_reads_every_math500_answer_and_compares_symbolically():
    rows = [json.loads(line) for line in (Path(__file__).resolve().parents[2].parent / "shared" / "data" /
                                          "math500.jsonl").read_text().splitlines()]  # fmt: skip
    assert len(rows) == 500
    for row in rows:  # each LaTeX answer (fractions, intervals, `p - q`, `\\$32,\\!348`) matches itself, boxed
        assert math_reward({"ground_truth": row["answer"]}, _chat(f"So $\\boxed{{{row['answer']}}}$.")) == 1.0, row
    assert math_reward({"ground_truth": "\\frac{14}{3}"}, _chat("It is $\\frac{28}{6}$, or 14/3")) == 1.0
    assert math_reward({"ground_truth": "p - q"}, _chat("The answer is $-q + p$.")) == 1.0
    assert math_reward({"ground_truth": "p - q"}, _chat("The answer is $p + q$.")) == 0.0
    assert math_reward({"ground_truth": "p - q"}, _chat("I do not know.")) == 0.0
    with pytest.raises(RewardError, match="ground_truth"):
        math_reward({}, _chat("1"))
    assert resolve_reward("math") is math_reward
    with pytest.raises(ConfigError, match="'llm_judge'"):
        resolve_reward("nope", also=["llm_judge"])
