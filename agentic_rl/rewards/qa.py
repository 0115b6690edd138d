"""Question-answering rewards: HotpotQA/SQuAD normalization, exact match and token F1 of the final short answer."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentic_rl.errors import RewardError
from agentic_rl.rewards.answers import extract_short_answer, final_answer_text

__all__ = ["answer_f1", "hotpotqa_em_reward", "hotpotqa_f1_reward", "normalize_answer"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """HotpotQA/SQuAD answer normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_f1(prediction: str, gold: str) -> tuple[float, float]:
    """(exact match, token F1) after `normalize_answer`, as in the HotpotQA evaluation script (Yang et al. 2018):
    a yes/no/noanswer gold or prediction scores 0 unless both are the same word."""
    pred, truth = normalize_answer(prediction), normalize_answer(gold)
    em = float(pred == truth)
    special = {"yes", "no", "noanswer"}
    if (pred in special or truth in special) and pred != truth:
        return em, 0.0
    pred_tokens, truth_tokens = pred.split(), truth.split()
    common = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if common == 0:
        return em, 0.0
    precision, recall = common / len(pred_tokens), common / len(truth_tokens)
    return em, 2 * precision * recall / (precision + recall)


def hotpotqa_f1_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """Token F1 of the final answer against `task["ground_truth"]` (HotpotQA normalization).

    Raises:
        RewardError: if the task has no ground truth.
    """
    if task.get("ground_truth") is None:
        raise RewardError("task has no 'ground_truth'")
    return answer_f1(extract_short_answer(final_answer_text(messages)), str(task["ground_truth"]))[1]


def hotpotqa_em_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """Exact match of the final answer against `task["ground_truth"]` (HotpotQA normalization)."""
    if task.get("ground_truth") is None:
        raise RewardError("task has no 'ground_truth'")
    return answer_f1(extract_short_answer(final_answer_text(messages)), str(task["ground_truth"]))[0]
