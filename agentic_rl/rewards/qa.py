"""Question-answering rewards: HotpotQA/SQuAD normalization, exact match and token F1 of the final short answer."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentic_rl.errors import RewardError
from agentic_rl.rewards.answers import extract_short_answer, final_answer_text, tagged_answer

__all__ = [
    "SHORT_ANSWER_WORDS",
    "answer_f1",
    "hotpotqa_em_reward",
    "hotpotqa_f1_reward",
    "hotpotqa_short_f1_reward",
    "normalize_answer",
]

SHORT_ANSWER_WORDS = 10
"""The most words a short answer may have (`hotpotqa_short_f1_reward`), or the reference's own count if larger: 99 %
of HotpotQA references have at most 9 (median 2)."""

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


def hotpotqa_short_f1_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """Token F1 of a short final answer in the form the research prompt asks for, 0 for any other form.

    The answer-format rule: the final message holds its answer inside `<answer></answer>` (the last such span is
    read), of at most `SHORT_ANSWER_WORDS` words (or as many as the reference has, if more). An answer without the
    tags, or longer, scores 0 whatever it quotes: token F1 pays a long answer that contains the reference its recall,
    so a policy trained on plain F1 can raise its share of answers with F1 > 0 by answering with passages instead of
    names. Otherwise the score is `hotpotqa_f1_reward`'s.

    Raises:
        RewardError: if the task has no ground truth.
    """
    if task.get("ground_truth") is None:
        raise RewardError("task has no 'ground_truth'")
    gold = str(task["ground_truth"])
    answer = tagged_answer(final_answer_text(messages))
    if answer is None or len(answer.split()) > max(SHORT_ANSWER_WORDS, len(gold.split())):
        return 0.0
    return answer_f1(answer, gold)[1]
