"""Reward functions: they score a finished trajectory's conversation against its task."""

from __future__ import annotations

import logging
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from agentic_rl.engine.chat_client import ChatClient
from agentic_rl.errors import ConfigError, RewardError

__all__ = [
    "REWARDS",
    "LLMJudgeReward",
    "answer_f1",
    "extract_short_answer",
    "extract_gsm8k_answer",
    "final_answer_text",
    "gsm8k_reward",
    "has_number_reward",
    "hotpotqa_em_reward",
    "hotpotqa_f1_reward",
    "math_reward",
    "math_verify_reward",
    "normalize_answer",
    "resolve_reward",
]

logger = logging.getLogger(__name__)
logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call made without a signal timeout

MAX_ANSWER_CHARS = 2000


def extract_gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after the last `####`, thousands separators removed.

    Raises:
        RewardError: if there is no `####` marker.
    """
    if "####" not in answer:
        raise RewardError("GSM8K ground truth has no '####' final-answer marker")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def final_answer_text(messages: Sequence[dict[str, str]]) -> str:
    """The last assistant message, without its `<think>` block, cut to its last 2000 characters."""
    from agentic_rl.parser import split_thought

    for message in reversed(messages):
        if message.get("role") == "assistant":
            return split_thought(message.get("content", ""))[1][-MAX_ANSWER_CHARS:]
    return ""


def math_verify_reward(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 when `math-verify` finds the last answer of `prediction` equal to `gold`, else 0.0.

    Uses Hugging Face `math-verify` (`parse` + `verify`) without its signal-based timeout, so it can run in
    worker threads; inputs are length-capped instead. `gold` may be several spellings of the ground truth, tried in
    order until one parses (the error quotes the last one: the text as written, after any added delimiters).

    Raises:
        RewardError: if no spelling of the ground truth parses.
    """
    from math_verify import parse, verify

    spellings = [gold] if isinstance(gold, str) else list(gold)
    gold_parsed = next((parsed for text in spellings if (parsed := parse(text, parsing_timeout=None))), None)
    if not gold_parsed:
        raise RewardError(f"cannot parse the ground truth {spellings[-1]!r}")
    predicted = parse(prediction, parsing_timeout=None)
    if not predicted:
        return 0.0
    return 1.0 if verify(gold_parsed, predicted, timeout_seconds=None) else 0.0


def gsm8k_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """GSM8K answer reward: the final assistant message's last number vs the ground truth, via `math-verify`.

    `task["ground_truth"]` may be a full GSM8K solution (the number after `####` is used) or the bare answer.

    Returns:
        1.0 or 0.0.

    Raises:
        RewardError: if the ground truth is missing or unparsable.
    """
    truth = _ground_truth(task)
    gold = extract_gsm8k_answer(truth) if "####" in truth else truth.replace(",", "").strip()
    value = math_verify_reward(final_answer_text(messages).replace(",", ""), gold)
    if not math.isfinite(value):
        raise RewardError(f"reward is not finite: {value}")
    return value


def math_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """MATH-style answer reward: the final assistant message's last answer (`\\boxed{}` or a LaTeX/plain
    expression) vs a LaTeX ground truth (`\\frac{14}{3}`, `p - q`, `(3, \\frac{\\pi}{2})`), via `math-verify`
    (Hugging Face; symbolic equality, so `\\frac{28}{6}` matches `\\frac{14}{3}` and `-q + p` matches `p - q`).

    The ground truth is read as LaTeX math (`$...$`) first, then as written: `math-verify` reads every MATH-500
    answer so (51 of them are not parsed as plain text).

    Returns:
        1.0 or 0.0.

    Raises:
        RewardError: if the ground truth is missing or unparsable.
    """
    truth = _ground_truth(task).strip()
    return math_verify_reward(final_answer_text(messages), [f"${truth}$", truth])


def _ground_truth(task: dict[str, Any]) -> str:
    truth = task.get("ground_truth")
    if truth is None:
        raise RewardError("task has no 'ground_truth'")
    return str(truth)


def has_number_reward(task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
    """A format reward: 1.0 when the final answer contains a digit, else 0.0 (a dense signal for smoke tests)."""
    return 1.0 if any(ch.isdigit() for ch in final_answer_text(messages)) else 0.0


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """HotpotQA/SQuAD answer normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_short_answer(text: str) -> str:
    """The short answer in a final message: `<answer>...</answer>`, else after the last "answer is"/"answer:",
    else the last non-empty line."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    stated = _ANSWER_IS.findall(text)
    if stated:
        return stated[-1].strip().splitlines()[0].strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


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


class LLMJudgeReward:
    """Asks a model whether the final answer matches the ground truth; 1.0 for a reply starting with "yes", else 0.0.

    The model is either a `ChatClient` called in process (e.g. an `EngineChatClient` over the run's own engine: no
    HTTP server) or a model behind an OpenAI-compatible endpoint.

    Args:
        base_url: e.g. `http://127.0.0.1:8000/v1`; not used when `client` is given.
        model: model name to send to the endpoint (needed with `base_url`).
        timeout_s: per-call timeout of the endpoint in seconds (an `EngineChatClient` has its own `timeout_s`).
        client: a `ChatClient` to ask instead of an endpoint.

    Raises:
        ConfigError: if neither `base_url` and `model` nor `client` are given.
        RewardError: from `__call__` when the judge call fails (the trajectory is then marked failed).
    """

    PROMPT = (
        "Question: {question}\nReference answer: {gold}\nPredicted answer: {prediction}\n"
        "Does the predicted answer mean the same as the reference answer? Reply with yes or no."
    )
    MAX_TOKENS = 4

    def __init__(self, base_url: str | None = None, *, model: str = "", timeout_s: float = 60.0,
                 client: ChatClient | None = None) -> None:  # fmt: skip
        self.chat_client = client
        self.model = model
        self.client: Any = None
        if client is None:
            if base_url is None or not model:
                raise ConfigError("LLMJudgeReward needs base_url and model, or client")
            import openai

            self.client = openai.OpenAI(base_url=base_url, api_key="local", timeout=timeout_s, max_retries=1)

    def __call__(self, task: dict[str, Any], messages: Sequence[dict[str, str]]) -> float:
        prediction = extract_short_answer(final_answer_text(messages))
        if not prediction:
            return 0.0
        content = self.PROMPT.format(question=task.get("question", ""), gold=task.get("ground_truth", ""),
                                     prediction=prediction)  # fmt: skip
        try:
            reply = self._ask([{"role": "user", "content": content}])
        except Exception as exc:
            raise RewardError(f"LLM judge call failed: {exc}") from exc
        return 1.0 if reply.strip().lower().startswith("yes") else 0.0

    def _ask(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply text. Blocks: from a worker thread of the event loop (as the harness runs rewards),
        the call runs on that loop; from a thread without a loop, on a new one."""
        if self.chat_client is None:
            reply = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.MAX_TOKENS, temperature=0.0
            )
            return reply.choices[0].message.content or ""
        import anyio

        client, started = self.chat_client, False

        async def ask() -> str:
            nonlocal started
            started = True
            return await client.chat(messages, max_tokens=self.MAX_TOKENS)

        try:
            return anyio.from_thread.run(ask)
        except RuntimeError:
            if started:  # the call itself failed
                raise
        return anyio.run(ask)  # not a worker thread of a running loop


REWARDS = {
    "gsm8k": gsm8k_reward,
    "has_number": has_number_reward,
    "math": math_reward,
    "hotpotqa_f1": hotpotqa_f1_reward,
    "hotpotqa_em": hotpotqa_em_reward,
}


def resolve_reward(name: str, *, also: Sequence[str] = ()) -> Callable[[dict[str, Any], Sequence[dict[str, str]]],
                                                                          float]:  # fmt: skip
    """A reward function by name: a key of `REWARDS`, or `package.module:function`.

    Args:
        name: the reward's name.
        also: other names the caller accepts itself (e.g. the CLI's `llm_judge`), listed in the error.

    Raises:
        ConfigError: if the name is unknown or the import fails.
    """
    if name in REWARDS:
        return REWARDS[name]
    module_name, sep, attr = name.partition(":")
    if not sep:
        names = sorted([*REWARDS, *also])
        raise ConfigError(f"unknown reward {name!r}: use one of {names} or 'package.module:function'")
    try:
        import importlib

        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import reward {name!r}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"reward {name!r} is not callable")
    return fn
