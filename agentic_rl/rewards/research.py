"""Diagnostics of a research trajectory, reported beside its reward (`TrainConfig.reward_metrics`), never rewarded.

They say what shape the answers and the searching take, which the answer F1 alone cannot: a policy whose F1 falls
may be answering sooner, answering at length (a quoted sentence has some word overlap with most references, and a
low precision), or no longer finding the documents. Each is a `fn(task, messages) -> float` as `MetricsReward`
calls it; `reward_figures` averages it over a step's trajectories (a 0/1 value becomes a share).

- `answer_words`: words of the short answer the QA rewards read (`extract_short_answer` of `final_answer_text`);
  0 without a final answer.
- `quotes_passage`: 1 when that short answer holds `QUOTE_WORDS` consecutive words (after HotpotQA normalization)
  of one tool result the trajectory read, i.e. it copies a passage rather than naming an answer.
- `searches`, `visits`: the assistant's calls of the `search` and `visit` tools (read as the tool environment
  reads them: `parser.parse_tool_calls`), arguments valid or not (a call whose name cannot be read is not one).
- `found_support`: 1 when a tool result showed one of the task's `supporting_doc_ids` (the shared HotpotQA file's
  column; as a whole word, e.g. `[hp00004]` in a search hit or a visited page).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentic_rl.errors import RewardError
from agentic_rl.rewards.answers import extract_short_answer, final_answer_text
from agentic_rl.rewards.qa import normalize_answer

__all__ = [
    "QUOTE_WORDS",
    "RESEARCH_METRICS",
    "answer_words",
    "found_support",
    "quotes_passage",
    "searches",
    "visits",
]

QUOTE_WORDS = 5
"""Consecutive normalized words an answer must share with one tool result to count as quoting it (a HotpotQA
answer is 2.2 words on average; 5 shared words in a row is a copied phrase, not a name)."""


def _tool_texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "tool" and isinstance(m.get("content"), str)]


def answer_words(task: dict[str, Any], messages: Sequence[dict[str, Any]]) -> float:
    """Words of the final short answer (whitespace-separated, before normalization); 0 without an answer."""
    return float(len(extract_short_answer(final_answer_text(messages)).split()))


def quotes_passage(task: dict[str, Any], messages: Sequence[dict[str, Any]]) -> float:
    """1.0 when the final short answer shares `QUOTE_WORDS` consecutive normalized words with one tool result."""
    words = normalize_answer(extract_short_answer(final_answer_text(messages))).split()
    if len(words) < QUOTE_WORDS:
        return 0.0
    padded = [f" {' '.join(normalize_answer(text).split())} " for text in _tool_texts(messages)]
    for i in range(len(words) - QUOTE_WORDS + 1):
        run = f" {' '.join(words[i : i + QUOTE_WORDS])} "
        if any(run in text for text in padded):
            return 1.0
    return 0.0


def _calls_named(messages: Sequence[dict[str, Any]], name: str) -> float:
    from agentic_rl.parser import parse_tool_calls

    count = 0
    for message in messages:
        if message.get("role") == "assistant" and isinstance(message.get("content"), str):
            count += sum(getattr(call, "name", None) == name for call in parse_tool_calls(message["content"]))
    return float(count)


def searches(task: dict[str, Any], messages: Sequence[dict[str, Any]]) -> float:
    """Calls of the `search` tool in the trajectory."""
    return _calls_named(messages, "search")


def visits(task: dict[str, Any], messages: Sequence[dict[str, Any]]) -> float:
    """Calls of the `visit` tool in the trajectory."""
    return _calls_named(messages, "visit")


def found_support(task: dict[str, Any], messages: Sequence[dict[str, Any]]) -> float:
    """1.0 when a tool result showed one of the task's `supporting_doc_ids` as a whole word.

    Raises:
        RewardError: if the task has no `supporting_doc_ids` list (the metric is then left out for it).
    """
    ids = task.get("supporting_doc_ids")
    if not isinstance(ids, list) or not ids:
        raise RewardError("task has no 'supporting_doc_ids' list")
    pattern = re.compile(r"(?<![\w])(?:" + "|".join(re.escape(str(i)) for i in ids) + r")(?![\w])")
    return float(any(pattern.search(text) for text in _tool_texts(messages)))


RESEARCH_METRICS = {
    "answer_words": answer_words,
    "quotes_passage": quotes_passage,
    "searches": searches,
    "visits": visits,
    "found_support": found_support,
}
"""The research diagnostics by the name `TrainConfig.reward_metrics` gives them."""
