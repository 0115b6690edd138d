"""Per-turn facts that shaping (`rewards.shaping`) weighs: the environment's own reward of a turn, and the task's
milestones a turn's tool results first show.

A milestone is a string of the task's `milestones` (an intermediate result, a supporting document's title); a turn
that first shows one, other than as an echo of what its own calls wrote (`milestone_reward`), earns a process reward
for step-level training, which most tasks leave out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.errors import EnvStepError
from agentic_rl.types import is_finite_number

__all__ = ["environment_turn_reward", "milestone_reward", "task_milestones"]


def environment_turn_reward(info: Mapping[str, Any], turn: int) -> float:
    """The environment's own reward for turn `turn`: `info["reward"]` of its `step()`, 0.0 when the key is absent.

    Raises:
        EnvStepError: naming the turn, if the value is not a finite number (a bool, a string, NaN, Inf).
    """
    value = info.get("reward", 0.0)
    if not is_finite_number(value):
        raise EnvStepError(
            f"turn {turn}: step() returned info['reward']={value!r}; a per-turn reward must be a finite number"
        )
    return float(value)


def task_milestones(task: Mapping[str, Any]) -> list[str]:
    """The task's `milestones`: a list of distinct non-empty strings, [] when the key is absent.

    Raises:
        EnvStepError: if `milestones` is not a list of non-empty strings (the trajectory fails, naming the key).
    """
    milestones = task.get("milestones")
    if milestones is None:
        return []
    if not isinstance(milestones, list) or not all(isinstance(m, str) and m.strip() for m in milestones):
        raise EnvStepError(f"a task's 'milestones' must be a list of non-empty strings, got {milestones!r}")
    return list(dict.fromkeys(m.strip() for m in milestones))


def milestone_reward(
    milestones: Sequence[str], reached: set[str], texts: Sequence[str], weight: float, *, action: str = ""
) -> float:
    """The milestone reward of one turn: `weight / len(milestones)` for each milestone that `texts` (the turn's tool
    results) show and `action` did not write, and that is not in `reached` yet; those are added to `reached` (in
    place).

    A milestone shows when it occurs in a text as a whole word: not inside a longer run of letters, digits or
    underscores, and for a number not as part of a longer number either (milestone `193` is not reached by `1930`,
    `-193`, `193.5`, `1,193` or `193,000`, but by `= 193` or `193 apples`).

    `action` is the turn's own tool-call text (`Step.action`). Tools echo their arguments (a calculator given the
    value returns it, a search repeats its query, an error quotes the bad expression), so what the policy wrote is
    not what it found. A number milestone is not reached when an argument of the calls holds a number of its
    absolute value, however spelled (`193.0`, `193e0`, `1,93`, `1_93`, `-(-193)`; not inside a word: `step2`). A
    text milestone is reached only by an occurrence outside every copy of an argument string in the results (a
    search for "Paris population" reaches "Paris" through a result's title, not through the echoed query; a visit
    by id does not reach that id). A malformed call's whole text counts as its argument. Either stays open for a
    later turn.
    """
    if not milestones:
        return 0.0
    written = _arguments(action)
    new = [
        m
        for m in milestones
        if m not in reached and not _number_written(m, written) and any(_shows(m, t, written) for t in texts)
    ]
    reached.update(new)
    return weight * len(new) / len(milestones)


_ACTION_NUMBER = re.compile(r"(?<![^\W\d])(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")  # not inside a word: `step2`


def _arguments(action: str) -> list[str]:
    """What the calls in `action` pass: every string or number among their arguments (nested lists and dicts), a
    malformed call's text as written, and `action` itself when it holds no `<tool_call>`."""
    from agentic_rl.parser import LLAMA3_JSON, ToolCall, parse_tool_calls

    if not action:
        return []
    calls = parse_tool_calls(action, call_format=LLAMA3_JSON)  # an action is call text: Llama 3's bare JSON too
    written: list[str] = []
    for call in calls:
        _values(call.arguments if isinstance(call, ToolCall) else call.raw, written)
    return [w for w in written if w.strip()] if calls else [action]


def _values(value: Any, into: list[str]) -> None:
    """Every string and number inside `value` (nested lists and dicts), as text, appended to `into`."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        into.append(str(value))
    elif isinstance(value, dict):
        for item in value.values():
            _values(item, into)
    elif isinstance(value, list):
        for item in value:
            _values(item, into)


def _number_written(milestone: str, written: Sequence[str]) -> bool:
    """Whether `milestone` is a number whose value one of the `written` arguments holds (see `milestone_reward`)."""
    value = _number(milestone)
    if value is None:
        return False
    for text in written:
        joined = re.sub(r"(?<=\d)[,_'](?=\d)", "", text)  # 1,93 / 1_93 / 1'93 -> 193
        if any(_number(n) == abs(value) for n in _ACTION_NUMBER.findall(joined)):  # either sign: `-(-193)` is 193
            return True
    return False


def _shows(milestone: str, text: str, written: Sequence[str]) -> bool:
    """Whether `text` shows `milestone` as a whole word (`_occurrences`); for a text milestone, at a place outside
    every copy of a `written` argument (a number milestone is judged by `_number_written` instead)."""
    copies = (
        []
        if _number(milestone) is not None
        else [(m.start(), m.end()) for w in {w.strip() for w in written} for m in re.finditer(re.escape(w), text)]
    )
    return any(not any(a <= m.start() and m.end() <= b for a, b in copies) for m in _occurrences(milestone, text))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _occurrences(milestone: str, text: str) -> list[re.Match[str]]:
    """Where `milestone` occurs in `text` as a whole word (see `milestone_reward`)."""
    return list(re.finditer(rf"(?<![\w.-])(?<!\d,){re.escape(milestone)}(?![\w]|[.,]\d)", text))
