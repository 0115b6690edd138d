"""Math rewards: GSM8K and MATH-style answers against their ground truth, via math-verify in a worker process."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from agentic_rl.errors import RewardError
from agentic_rl.rewards.answers import (
    MAX_ANSWER_CHARS,
    extract_gsm8k_answer,
    extract_number_answer,
    final_answer_text,
    ground_truth,
    last_boxed,
    marked_answer,
)

__all__ = ["MATH_VERIFY_TIMEOUT_S", "gsm8k_reward", "has_number_reward", "math_reward", "math_verify_reward"]

MATH_VERIFY_TIMEOUT_S = 10.0
"""Most seconds one math-verify call may run (in a worker process); past it the reward fails with `RewardError`."""

_UNARY_PLUS = re.compile(r"(?<![\w.)\]}])\+(?=\\?\$?\d)")  # `+12`, `(+3`: a sign; `2+3`, `-2 + 7i`: a sum
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _signed(text: str) -> str:
    """`text` with a unary `+` dropped and a Unicode minus read as `-` (math-verify reads neither). A `+` is unary
    when a number follows it right away and no word, digit or closing bracket stands right before it."""
    return _UNARY_PLUS.sub("", text.replace("\u2212", "-"))


def _plain_number_latex(text: str) -> str:
    """A boxed numeric answer as math-verify reads it: signed (`_signed`), without `$`, `%` or thousands separators
    (`\\$1,600` -> `1600`)."""
    return _THOUSANDS.sub("", _signed(text).replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", ""))


def _math_answer_text(text: str) -> str:
    """What math-verify reads of a final message: the marked answer (`\\boxed{}` again around a boxed one), else the
    message's last `MAX_ANSWER_CHARS` characters; a unary `+` dropped and a Unicode minus read as `-`."""
    boxed = last_boxed(text)
    marked = f"\\boxed{{{boxed}}}" if boxed is not None else marked_answer(text)
    return _signed(marked if marked is not None else text[-MAX_ANSWER_CHARS:])


def math_verify_reward(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 when `math-verify` finds the answer of `prediction` equal to `gold`, else 0.0.

    Uses Hugging Face `math-verify` (`parse` + `verify`) in a worker process (`rewards.pool.math_verify_pool`):
    past `MATH_VERIFY_TIMEOUT_S` the worker is killed and the call fails, so an answer math-verify cannot finish
    (e.g. `2^{2^{2^{2^{2^{2}}}}}`) never hangs a rollout. `gold` may be several spellings of the ground truth,
    tried in order until one parses (the error quotes the last one: the text as written, after any added
    delimiters).

    Raises:
        RewardError: if no spelling of the ground truth parses, or math-verify did not finish in time.
    """
    from agentic_rl.rewards.pool import math_verify_pool

    spellings = [gold] if isinstance(gold, str) else list(gold)
    return float(math_verify_pool().call("math_verify", (prediction, spellings), timeout_s=MATH_VERIFY_TIMEOUT_S))


def gsm8k_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """GSM8K answer reward: the final assistant message's numeric answer vs the ground truth, via `math-verify`.

    The answer is the last `\\boxed{}` (math-verify reads it, so `\\boxed{\\frac{24}{2}}` is 12), else read by
    `extract_number_answer`: the first number of the marked answer (`<answer>`, `####`, "answer is") wherever it
    stands, else the last number; signed or not, with `$`, thousands separators, a trailing period or `%`. `12.0`
    matches `12` (math-verify compares the values). `task["ground_truth"]` may be a full
    GSM8K solution (the number after `####` is used) or the bare answer.

    Returns:
        1.0 or 0.0 (0.0 when the message holds no number).

    Raises:
        RewardError: if the ground truth is missing or unparsable, or math-verify did not finish in time.
    """
    truth = ground_truth(task)
    raw = extract_gsm8k_answer(truth) if "####" in truth else truth
    number = extract_number_answer(raw)
    gold = number or raw.replace(",", "").strip()  # math-verify reads what the number reader does not (`.5`)
    text = final_answer_text(messages)
    boxed = last_boxed(text)
    answer = f"\\boxed{{{_plain_number_latex(boxed)}}}" if boxed is not None else extract_number_answer(text)
    if answer is None:
        if number is None:  # a ground truth math-verify cannot read fails every sample alike, with a number or not
            math_verify_reward(gold, gold)
        return 0.0
    value = math_verify_reward(answer, gold)
    if not math.isfinite(value):
        raise RewardError(f"reward is not finite: {value}")
    return value


def math_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """MATH-style answer reward: the final assistant message's answer (`\\boxed{}` or a LaTeX/plain expression)
    vs a LaTeX ground truth (`\\frac{14}{3}`, `p - q`, `(3, \\frac{\\pi}{2})`), via `math-verify` (Hugging Face;
    symbolic equality, so `\\frac{28}{6}` matches `\\frac{14}{3}` and `-q + p` matches `p - q`).

    math-verify reads the marked answer (`marked_answer`: the last `\\boxed{}`, "answer is", ... wherever it
    stands), else the message's last `MAX_ANSWER_CHARS` characters; a unary `+` is dropped (`+12` is `12`). The
    ground truth is read as LaTeX math (`$...$`) first, then as written: `math-verify` reads every MATH-500
    answer so (51 of them are not parsed as plain text).

    Returns:
        1.0 or 0.0.

    Raises:
        RewardError: if the ground truth is missing or unparsable, or math-verify did not finish in time.
    """
    truth = ground_truth(task).strip()
    return math_verify_reward(_math_answer_text(final_answer_text(messages)), [f"${truth}$", truth])


def has_number_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """A format reward: 1.0 when the final answer contains a digit, else 0.0 (a dense signal for smoke tests)."""
    return 1.0 if any(ch.isdigit() for ch in final_answer_text(messages)) else 0.0
