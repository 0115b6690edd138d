"""Evaluation statistics over K samples per task: whether a sample is correct, a task's pass@k and avg@K, their
means over tasks, maj@K, the answer a sample votes for, and a seeded bootstrap interval of a paired difference. Pure
Python (`agentic-rl eval` and a training run's held-out evaluation compute their figures here)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from agentic_rl.rewards.answers import extract_number_answer, extract_short_answer, final_answer_text, last_boxed

__all__ = [
    "bootstrap_interval",
    "majority_vote",
    "mean_pass_at_k",
    "pass_at_k",
    "sample_correct",
    "task_pass_figures",
    "vote_answer",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one task from `n` samples of which `c` are correct.

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1: pass@k = 1 - C(n-c, k) / C(n, k),
    the probability that a k-subset drawn without replacement from the n samples holds at least one correct one
    (averaged over tasks, it estimates E_tasks[pass@k]). Computed in the numerically stable product form of the
    paper's code: C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i); 1.0 when n - c < k.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def sample_correct(metrics: Mapping[str, Any] | None) -> bool:
    """Whether a sample is correct: its task reward (`metrics["res_reward"]`, a trajectory's or its record's) is > 0,
    as the rollout summary's accuracy counts; a sample without one (e.g. failed) is not."""
    return (metrics or {}).get("res_reward", 0.0) > 0


def task_pass_figures(correct: Sequence[bool]) -> dict[str, Any]:
    """The figures of one task from whether each of its n samples is correct (`sample_correct`).

    Returns:
        `n` (samples), `c` (correct ones), `pass@k` (`{str(k): pass_at_k(n, c, k)}` for k = 1..n; empty when n = 0)
        and `avg@K` (c / n, the share of correct samples; 0.0 when n = 0).
    """
    n, c = len(correct), sum(bool(x) for x in correct)
    return {
        "n": n,
        "c": c,
        "pass@k": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
        "avg@K": c / n if n else 0.0,
    }


def mean_pass_at_k(rows: Sequence[Mapping[str, Any]], samples: int) -> dict[str, float]:
    """The mean over tasks of pass@k for k = 1..`samples`, from per-task rows (`task_pass_figures`) that each hold
    `pass@k` up to at least `samples`.

    Returns:
        `{str(k): mean}` for k = 1..samples.

    Raises:
        ValueError: for no rows; KeyError: for a row with fewer than `samples` samples.
    """
    if not rows:
        raise ValueError("pass@k needs at least one task")
    return {str(k): sum(row["pass@k"][str(k)] for row in rows) / len(rows) for k in range(1, samples + 1)}


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """maj@K of one task: the most frequent extracted answer among its samples, and whether it is correct.

    A sample whose answer is None (none extracted) does not vote. Ties between answers of the same count go to the
    answer that occurs first (lowest sample index). The answer's correctness is that of the first sample that gave
    it (samples with the same extracted answer get the same task reward).

    Returns:
        `(answer, correct)`; `(None, False)` when no sample voted.
    """
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, answer in enumerate(answers):
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
            first.setdefault(answer, i)
    if not counts:
        return None, False
    winner = max(counts, key=lambda a: (counts[a], -first[a]))
    return winner, bool(correct[first[winner]])


def _number(text: str) -> str:
    """A decimal number written canonically (`12.0`, `12` and `12.00` alike read `12`); other text as it is."""
    try:
        value = Decimal(text).normalize()
    except InvalidOperation:
        return text
    return format(value, "f") if value != 0 else "0"


def vote_answer(reward: str, messages: Sequence[dict[str, Any]]) -> str | None:
    """The answer a sample votes for in maj@K, read as the task's reward reads it (`rewards/answers.py`).

    gsm8k, has_number: the number in the last `\\boxed{}`, else `extract_number_answer` of the final answer
    (decimal-normalized; a box without a number votes its text). math: the last `\\boxed{}`'s text, else the
    number. Other rewards: `extract_short_answer`, lower-cased with whitespace collapsed.

    Returns:
        The answer, or None when the final answer holds none (the sample does not vote).
    """
    text = final_answer_text(messages)
    if not text.strip():
        return None
    if reward in ("gsm8k", "has_number", "math"):
        boxed = last_boxed(text)
        if boxed is not None and reward == "math":
            return " ".join(boxed.split()) or None
        number = extract_number_answer(boxed if boxed is not None else text)
        if number is not None:
            return _number(number)
        return (" ".join(boxed.split()) or None) if boxed is not None else None
    short = " ".join(extract_short_answer(text).lower().split())
    return short or None


def bootstrap_interval(
    values: Sequence[float], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of `values` (e.g. per-task paired differences).

    Each of `resamples` resamples draws len(values) values with replacement by `random.Random(seed).randrange`
    (in order: resample 1's draws, then resample 2's, ...); the resample means are sorted, and the interval is
    `[means[floor(a * N)], means[ceil((1 - a) * N) - 1]]` with a = (1 - level) / 2 and N = `resamples`
    (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13).

    Raises:
        ValueError: for no values, resamples < 1 or a level outside (0, 1).
    """
    if not values or resamples < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap needs values, resamples >= 1 and 0 < level < 1 (got {len(values)}, {resamples})")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    alpha = (1 - level) / 2
    return means[math.floor(alpha * resamples)], means[math.ceil((1 - alpha) * resamples) - 1]
