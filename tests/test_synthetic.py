"""Seeded arithmetic word problems: deterministic, disjoint splits, answers that follow from the numbers."""

from __future__ import annotations

import re

import pytest

from agentic_rl.data import load_tasks
from agentic_rl.errors import ConfigError
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.synthetic import arithmetic_problem, arithmetic_tasks, parse_arithmetic_spec


def _numbers(question: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", question)]


def test_problems_are_deterministic_and_the_splits_disjoint():
    train, heldout = arithmetic_tasks("train", 300), arithmetic_tasks("heldout", 300)
    assert train == arithmetic_tasks("train", 300)
    assert not {t["question"] for t in train} & {t["question"] for t in heldout}
    assert len({t["id"] for t in train + heldout}) == 600
    assert [t["steps"] for t in train[:4]] == [1, 2, 1, 2]


@pytest.mark.parametrize("steps", [1, 2])
def test_answers_follow_from_the_numbers_of_the_question(steps):
    for seed in range(200):
        task = arithmetic_problem(seed, steps)
        numbers, answer = _numbers(task["question"]), int(task["ground_truth"])
        assert answer > 0 and len(numbers) == steps + 1
        if steps == 1:
            a, b = numbers
            assert answer in (a + b, a - b, a * b, a // b) and (answer != a // b or a % b == 0)
        else:
            a, b, c = numbers
            assert answer in (a + b * c, a - b + c, a * b - c)
        assert max(numbers) >= 12  # no single-digit arithmetic
        assert len(task["milestones"]) == steps - 1 and task["ground_truth"] not in task["milestones"]
        if steps == 2:  # the intermediate result of the question's first operation
            assert int(task["milestones"][0]) in (b * c, a - b, a * b)
            assert answer in (a + int(task["milestones"][0]), int(task["milestones"][0]) + c, int(task["milestones"][0]) - c)


def test_the_gsm8k_reward_reads_a_clearly_stated_answer():
    task = arithmetic_problem(3, 2)
    answer = task["ground_truth"]
    for text, reward in [(f"The answer is {answer}.", 1.0), (f"{answer}", 1.0), (f"So {answer} in total", 1.0),
                         (f"{int(answer) + 1}", 0.0), ("I do not know", 0.0)]:  # fmt: skip
        assert gsm8k_reward(task, [{"role": "assistant", "content": text}]) == reward, text


def test_specs_and_their_errors():
    assert parse_arithmetic_spec("gsm8k.jsonl") is None
    assert [t["steps"] for t in parse_arithmetic_spec("arithmetic:heldout:3:1")] == [1, 1, 1]
    assert load_tasks("arithmetic:train:10", limit=4) == arithmetic_tasks("train", 4)
    for bad in ("arithmetic:valid:3", "arithmetic:train:x", "arithmetic:train:3:3", "arithmetic:train"):
        with pytest.raises(ConfigError):
            load_tasks(bad)
    with pytest.raises(ValueError, match="steps must be 1 or 2"):
        arithmetic_problem(0, 3)
    with pytest.raises(ValueError, match="count"):
        arithmetic_tasks("train", 0)
