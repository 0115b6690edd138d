"""Per-turn rewards: what the harness writes into each `Step.reward` of a trajectory.

A turn's reward is the sum of
- the environment's own reward for it: `info["reward"]` of the `step()` that reacted to the turn (0 when absent);
- its share of the tool-call reward: `toolcall_weight * well_formed_calls_k / tool_calls` with `well_formed_calls_k`
  the well-formed calls of turn k (its `info["well_formed_calls"]`) and `tool_calls` the trajectory's attempted
  calls, so that the shares add up to the trajectory's `toolcall_reward`;
- its milestone reward: `milestone_weight / len(milestones)` for each of the task's `milestones` (strings: an
  intermediate result, a supporting document's title) that first appears in this turn's tool results and not in
  its own tool calls (`milestone_reward`); a process reward for step-level training, which most tasks leave out;
- on the last turn only, the final answer's reward (`reward_fn`).

The sum of a trajectory's step rewards therefore equals its `trajectory_reward` (up to float rounding) whenever the
environment gives no per-turn reward of its own and no milestone is set; per-turn environment and milestone rewards
are added to the steps only (they are what step-level training, `GRPOConfig.advantage = "step"`, learns from), never
to `trajectory_reward`. A failed trajectory's turns get no tool-call or answer share (its `trajectory_reward` is 0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.errors import EnvStepError
from agentic_rl.types import Step, is_finite_number

__all__ = ["credit_turns", "environment_turn_reward", "milestone_reward", "task_milestones"]


def environment_turn_reward(info: Mapping[str, Any], turn: int) -> float:
    """The environment's own reward for turn `turn`: `info["reward"]` of its `step()`, 0.0 when the key is absent.

    Raises:
        EnvStepError: naming the turn, if the value is not a finite number (a bool, a string, NaN, Inf).
    """
    value = info.get("reward", 0.0)
    if not is_finite_number(value):
        raise EnvStepError(f"turn {turn}: step() returned info['reward']={value!r}; a per-turn reward must be a finite "
                           "number")  # fmt: skip
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


def milestone_reward(milestones: Sequence[str], reached: set[str], texts: Sequence[str], weight: float, *,
                     action: str = "") -> float:  # fmt: skip
    """The milestone reward of one turn: `weight / len(milestones)` for each milestone that appears in `texts` (the
    turn's tool results), not in `action`, and is not in `reached` yet; those are added to `reached` (in place).

    A milestone appears when it occurs in a text as a whole word: not inside a longer run of letters, digits or
    underscores, and for a number not as part of a longer number either (milestone `193` is not reached by `1930`,
    `-193`, `193.5`, `1,193` or `193,000`, but by `= 193` or `193 apples`).

    `action` is the turn's own tool-call text (`Step.action`): tools echo their arguments (a calculator given the
    value returns it, a search repeats its query, an error quotes the bad expression), so what the policy wrote is
    not what it found. A number milestone is not reached when any number of the action has its value, however
    spelled (`193.0`, `193e0`, `1,93`, `1_93`); a text milestone is looked for in the results with every string the
    calls pass as an argument (and a malformed call's whole text) cut out, so a search for "Paris population" may
    reach "Paris" through a result's title but not through the echoed query. Either stays open for a later turn.
    """
    if not milestones:
        return 0.0
    found = _echo_free(texts, action) if action else list(texts)
    new = [m for m in milestones if m not in reached and not _number_written(m, action)
           and any(_occurs(m, text) for text in (texts if _number(m) is not None else found))]  # fmt: skip
    reached.update(new)
    return weight * len(new) / len(milestones)


_ACTION_NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+")


def _number_written(milestone: str, action: str) -> bool:
    """Whether `milestone` is a number whose value `action` writes (see `milestone_reward`)."""
    value = _number(milestone)
    if value is None or not action:
        return False
    joined = re.sub(r"(?<=[\d.])[,_'](?=\d)", "", action)  # 1,93 / 1_93 / 1'93 -> 193
    return any(_number(n) == abs(value) for n in _ACTION_NUMBER.findall(joined))  # unsigned: `-193` writes 193


def _echo_free(texts: Sequence[str], action: str) -> list[str]:
    """`texts` with every argument string of the calls in `action` (and each malformed call's text) cut out."""
    from agentic_rl.parser import ToolCall, parse_tool_calls

    written: list[str] = []
    for call in parse_tool_calls(action):
        _strings(call.arguments if isinstance(call, ToolCall) else call.raw, written)
    cuts = sorted({w.strip() for w in written if w.strip()}, key=len, reverse=True)
    out = []
    for text in texts:
        for cut in cuts:
            text = text.replace(cut, " ")
        out.append(text)
    return out


def _strings(value: Any, into: list[str]) -> None:
    """Every string inside `value` (nested lists and dicts), appended to `into`."""
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, into)
    elif isinstance(value, list):
        for item in value:
            _strings(item, into)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _occurs(milestone: str, text: str) -> bool:
    return re.search(rf"(?<![\w.-])(?<!\d,){re.escape(milestone)}(?![\w]|[.,]\d)", text) is not None


def credit_turns(steps: Sequence[Step], *, answer_reward: float, toolcall_weight: float, tool_calls: int) -> None:
    """Add each turn's tool-call share, and the answer's reward to the last turn, to `Step.reward` (in place).

    Args:
        steps: the trajectory's steps, each `reward` holding the environment's own reward for that turn.
        answer_reward: the final answer's reward (0 for a failed trajectory).
        toolcall_weight: the tool-call reward's scale (`HarnessConfig.toolcall_weight`; 0 for a failed trajectory).
        tool_calls: the tool calls the trajectory attempted (0: no tool-call share).
    """
    if tool_calls:
        for step in steps:
            step.reward += toolcall_weight * int(step.info.get("well_formed_calls", 0)) / tool_calls
    if steps:
        steps[-1].reward += answer_reward
