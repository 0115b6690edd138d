"""Per-turn rewards: what the harness writes into each `Step.reward` of a trajectory.

A turn's reward is the sum of
- the environment's own reward for it: `info["reward"]` of the `step()` that reacted to the turn (0 when absent);
- its share of the tool-call reward: `toolcall_weight * well_formed_calls_k / tool_calls` with `well_formed_calls_k`
  the well-formed calls of turn k (its `info["well_formed_calls"]`) and `tool_calls` the trajectory's attempted
  calls, so that the shares add up to the trajectory's `toolcall_reward`;
- on the last turn only, the final answer's reward (`reward_fn`).

The sum of a trajectory's step rewards therefore equals its `trajectory_reward` (up to float rounding) whenever the
environment gives no per-turn reward of its own; per-turn environment rewards are added to the steps only (they are
what step-level training, `GRPOConfig.advantage = "step"`, learns from), never to `trajectory_reward`. A failed
trajectory's turns get no tool-call or answer share (its `trajectory_reward` is 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.errors import EnvStepError
from agentic_rl.types import Step, is_finite_number

__all__ = ["credit_turns", "environment_turn_reward"]


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
