"""Answer readers: where a finished conversation's final answer stands, and what it says."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentic_rl.errors import RewardError

__all__ = [
    "MAX_ANSWER_CHARS",
    "extract_gsm8k_answer",
    "extract_number_answer",
    "extract_short_answer",
    "final_answer_text",
    "ground_truth",
    "last_boxed",
    "marked_answer",
    "tagged_answer",
]

MAX_ANSWER_CHARS = 2000
"""How much of a final message's end math-verify reads when the message marks no final answer."""


def extract_gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after the last `####`, thousands separators removed.

    Raises:
        RewardError: if there is no `####` marker.
    """
    if "####" not in answer:
        raise RewardError("GSM8K ground truth has no '####' final-answer marker")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def final_answer_text(messages: Sequence[dict[str, Any]]) -> str:
    """The final answer: the last assistant message without its reasoning (`<think>` blocks; see `marked_answer`
    for where the answer stands in the rest), or "" when there is none. Content given as OpenAI content parts is
    read from its text parts, one per line (a reasoning part is not the answer).

    A message that calls a tool (OpenAI `tool_calls` or `function_call`, or a `<tool_call>` block as
    `parser.find_tool_calls` reads it, well-formed or not, as `ToolEnvironment` runs it; a `[TOOL_CALLS]` turn, and a
    message that is wholly Llama 3 JSON call objects, read in every format here, since a reward does not know the
    template: an answer shaped as a call is not an answer) is an action, not an
    answer: when the last assistant message is one (the trajectory was cut while it still called tools: termination
    `max_steps` or `context_limit`), there is no final answer, and every reward built on this function scores it as
    an empty answer. So a call's arguments never earn answer reward: an expression whose last number is the result,
    a search query that names the answer. A final answer that writes `<tool_call>` in its prose counts as a call
    too (the environment would have run it). An environment whose episode ends on a tool call (a `submit` tool)
    needs a reward of its own that reads that call."""
    from agentic_rl.parser import LLAMA3_JSON, find_tool_calls, strip_thoughts

    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = _message_text(message.get("content"))
            if (
                message.get("tool_calls")
                or message.get("function_call")
                or find_tool_calls(content, call_format=LLAMA3_JSON)[0] >= 0
            ):
                return ""
            return strip_thoughts(content)
    return ""


def _message_text(content: Any) -> str:
    """A message's text: a string as it is; OpenAI content parts, the `text` of each text part (or plain string),
    one per line; "" for anything else (None, a number)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p if isinstance(p, str) else p.get("text")
            for p in content
            if isinstance(p, str) or (isinstance(p, dict) and p.get("type", "text") == "text")
        ]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


# ---- where the final answer stands -------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# GSM8K's marker: `####` before a value (on its line or the next, markdown emphasis allowed), not a markdown heading
# such as `#### Step 2` or `#### 2. Double it`.
_HASHES = re.compile(r"####(?=[\s*_]*[-+\u2212$\\]*\.?\d)(?![ \t*_]*\d+\.[ \t]+[A-Za-z])")
_ANSWER_IS = re.compile(r"\banswer\b[*_]*\s*(?:is\b|:|=)[*_:]*", re.IGNORECASE)
_NUMBER = re.compile(
    r"(?<![\w.)\]}])(?P<sign>[+\-\u2212])?(?:\\?\$\s*)?(?P<digits>\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?P<decimals>\.\d+)?"
)
_SENTENCE_END = re.compile(r"\.(?=\s)")


def last_boxed(text: str) -> str | None:
    """The content of the last non-empty `\\boxed{...}` / `\\fbox{...}` of `text`, braces balanced (an unclosed
    one runs to the end); None when there is none."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        content = text[match.end() : end - 1 if depth == 0 else end].strip()
        if content:
            return content
    return None


def _last_after(text: str, marker: re.Pattern[str]) -> str | None:
    """What follows the last match of `marker` in `text` that is followed by anything: up to the end of its sentence
    or line (the next line when the marker ends its line; a sentence ends at a period followed by white space), or
    a whole display-math block (`$$ ... $$`, `\\[ ... \\]`) that opens there."""
    for match in reversed(list(marker.finditer(text))):
        rest = _rest_after(text, match, MAX_ANSWER_CHARS)
        opener = rest.split("\n", 1)[0].strip()
        if opener in _DISPLAY_MATH:  # "Answer:\n$$\n\\frac{14}{3}\n$$": the whole display block
            end = rest.find(_DISPLAY_MATH[opener], rest.find(opener) + len(opener))
            return rest[: end + len(_DISPLAY_MATH[opener])].strip() if end >= 0 else rest.strip()
        span = _SENTENCE_END.split(rest.split("\n", 1)[0], maxsplit=1)[0].strip()
        if span:
            return span
    return None


_DISPLAY_MATH = {"$$": "$$", "\\[": "\\]"}


def _rest_after(text: str, match: re.Match[str], limit: int | None = None) -> str:
    """The text after a marker's `match` (at most `limit` characters): blanks, emphasis and colons after it
    dropped, and from the next line on when the marker ends its line."""
    rest = text[match.end() : None if limit is None else match.end() + limit].lstrip(" \t*_:")
    return rest.lstrip() if rest.startswith("\n") else rest


def tagged_answer(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` of `text` (any case), stripped; None when there is none.

    Found from the end with `rfind` (linear: a regex would go quadratic on many unclosed tags)."""
    lowered = text.lower()
    end = lowered.rfind("</answer>")
    start = lowered.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>") : end].strip() if start >= 0 else None


def marked_answer(text: str) -> str | None:
    """The explicitly marked final answer of `text`: the content of the last `\\boxed{}`, else of the last
    `<answer>...</answer>`, else the sentence after the last `####` that precedes a value (a markdown heading such
    as `#### Step 2` is no marker), else the sentence after the last "answer is" / "answer:" (any case, e.g. "The
    final answer is", "**Answer:**"); a display-math block (`$$...$$`, `\\[...\\]`) that opens right after a
    marker is taken whole. None when nothing marks an answer.

    A marker is looked for anywhere in the text, so an answer followed by a long explanation is found."""
    for find in (last_boxed, tagged_answer, lambda t: _last_after(t, _HASHES), lambda t: _last_after(t, _ANSWER_IS)):
        span = find(text)
        if span:
            return span
    return None


def _numbers(text: str) -> list[str]:
    """Every number of `text` as a plain decimal: its sign kept (`+` dropped, a Unicode minus read as `-`), `$`/`\\$`
    and thousands separators removed (`-$1,600.50` -> `-1600.50`). A sign belongs to a number only right before
    it and not right after a word, digit or closing bracket: `20-5` and `20 - 5` read 20 and 5."""
    found = []
    for match in _NUMBER.finditer(text):
        sign = "-" if match["sign"] not in (None, "+") else ""
        found.append(sign + match["digits"].replace(",", "") + (match["decimals"] or ""))
    return found


def extract_number_answer(text: str) -> str | None:
    """The final numeric answer of `text` as a plain decimal string (see `_numbers` for how it is read).

    The rule: the first number of the explicitly marked answer (`marked_answer`: a `\\boxed{}`, `<answer>`,
    `####` or "answer is", wherever it stands), after its last `=` when it has one ("The answer is 48/2 = 24"
    reads 24); when no marked answer holds a number, the last number of the text. "The answer is +12. (Checking:
    3 * 4 = 12, and 15 - 3 = 12 ...)" reads 12, however long the check.

    Returns:
        e.g. `"12"`, `"-3.5"`, `"1600"`; None when the text holds no number.
    """
    marked = marked_answer(text)
    numbers = _numbers(marked.rsplit("=", 1)[-1]) or _numbers(marked) if marked is not None else []
    if numbers:
        return numbers[0]
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


def extract_short_answer(text: str) -> str:
    """The short answer in a final message: `<answer>...</answer>`, else the last `\\boxed{}`, else the rest of the
    line after the last "answer is" / "answer:" (markdown emphasis dropped; the next line when the marker ends its
    line), else the last non-empty line."""
    for marked in (tagged_answer(text), last_boxed(text)):
        if marked is not None:
            return marked
    for match in reversed(list(_ANSWER_IS.finditer(text))):
        stated = _rest_after(text, match).split("\n", 1)[0].strip().strip("*_").strip()
        if stated:
            return stated
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def ground_truth(task: dict[str, Any]) -> str:
    """The task's `ground_truth`, as text.

    Raises:
        RewardError: if the task has none.
    """
    truth = task.get("ground_truth")
    if truth is None:
        raise RewardError("task has no 'ground_truth'")
    return str(truth)
