"""Trajectory records produced by a rollout: what the engine sampled, what the environment inserted, rewards.

Only validation lives here, no I/O. Token tensors are 1-D; `response_masks` marks each response token with 1 when
the engine sampled it and 0 when the environment inserted it (tool observations, chat-template glue).

Names along the token path: token ids are `*_ids` (`prompt_ids`, `response_ids`, `Generation.token_ids`), the
sampled/inserted mask is `response_mask` and log-probabilities (nats) are `*_logprobs`, from the engine through
the JSON record (`trajectory_to_dict`) and the packed batch. The one exception is `Trajectory` itself, whose fields
keep the AgentSDK names: `prompt_tokens`, `response_tokens`, `response_masks`, `response_logprobs`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from agentic_rl.errors import TrajectoryError

__all__ = ["Step", "StepTrajectory", "Trajectory", "default_metrics", "trajectory_from_dict", "trajectory_to_dict"]


def default_metrics() -> dict[str, Any]:
    """The metrics every trajectory starts with (times in seconds)."""
    return {
        "steps": 0,
        "toolcall_reward": 0.0,
        "res_reward": 0.0,
        "reward_time": 0.0,
        "env_time": 0.0,
        "llm_time": 0.0,
        "total_time": 0.0,
    }


def _as_1d_tensor(name: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float64 if dtype.is_floating_point else None)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TrajectoryError(
                f"{name} must be a 1-D tensor or a list of numbers, got {type(value).__name__}"
            ) from exc
        if value.numel() == 0:
            value = value.to(dtype)
    if value.dim() != 1:
        raise TrajectoryError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    if value.is_complex():
        raise TrajectoryError(f"{name} must be real, got {value.dtype}")
    if value.is_floating_point():
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            raise TrajectoryError(f"{name} contains {int((~finite).sum())} NaN or Inf value(s)")
    if dtype.is_floating_point:
        return value.to(dtype)
    if value.is_floating_point():
        if not bool((value == value.round()).all()):
            raise TrajectoryError(f"{name} holds token ids, got non-integer values")
    return value.to(dtype)


@dataclass
class Trajectory:
    """One rollout of one task, as token ids ready for packing.

    Attributes:
        prompt_tokens: (P,) int64, the rendered first prompt (system + user turn + generation prompt). Lists and
            integer-valued float tensors are converted to int64.
        response_tokens: (R,) int64, everything after the prompt: sampled tokens and inserted observation tokens.
        response_masks: (R,) int64, 1 where the engine sampled the token, 0 where the environment inserted it.
        idx: position of the task in the input batch.
        trajectory_reward: scalar reward of the whole trajectory.
        chat_completions: the conversation as `{"role", "content"}` messages.
        metrics: `steps`, `toolcall_reward`, `res_reward` and times in seconds (`reward_time`, `env_time`,
            `llm_time`, `total_time`); rollouts add more keys (tool-call counts, alignment checks).
        response_logprobs: (R,) float32 log-probabilities (nats) the engine reported for the sampled tokens, 0 where
            `response_masks` is 0; None when not recorded.
        termination_reason: why the turn loop stopped: `env_done`, `max_steps`, `truncated`, `context_limit`,
            `prompt_too_long`, `invalid_task`, `error`, `timeout` (an engine request past the per-turn limit),
            `aborted` (the engine aborted a turn) or `cancelled`.
        failed: True when the trajectory ended in an error (`error` says which); packing marks it invalid, so it
            is excluded from GRPO group statistics and the loss.
        error: the error message of a failed trajectory.

    Raises:
        TrajectoryError: if a token tensor is not 1-D, holds NaN, Inf or non-integer ids, the mask holds values
            other than 0 and 1, or the mask or logprobs length differs from `response_tokens`.
    """

    prompt_tokens: torch.Tensor
    response_tokens: torch.Tensor
    response_masks: torch.Tensor
    idx: int = 0
    trajectory_reward: float | int = 0.0
    chat_completions: list[dict[str, str]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=default_metrics)
    response_logprobs: torch.Tensor | None = None
    termination_reason: str = ""
    failed: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        self.prompt_tokens = _as_1d_tensor("prompt_tokens", self.prompt_tokens, torch.long)
        self.response_tokens = _as_1d_tensor("response_tokens", self.response_tokens, torch.long)
        self.response_masks = _as_1d_tensor("response_masks", self.response_masks, torch.long)
        if bool(((self.response_masks != 0) & (self.response_masks != 1)).any()):
            raise TrajectoryError("response_masks must hold only 0 and 1")
        n = self.response_tokens.numel()
        if self.response_masks.numel() != n:
            raise TrajectoryError(f"response_masks has {self.response_masks.numel()} entries, response_tokens has {n}")
        if self.response_logprobs is not None:
            self.response_logprobs = _as_1d_tensor("response_logprobs", self.response_logprobs, torch.float32)
            if self.response_logprobs.numel() != n:
                raise TrajectoryError(
                    f"response_logprobs has {self.response_logprobs.numel()} entries, response_tokens has {n}"
                )
        reward = self.trajectory_reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise TrajectoryError(f"trajectory_reward must be a finite number, got {reward!r}")
        self.metrics = {**default_metrics(), **self.metrics}

    @property
    def num_generated_tokens(self) -> int:
        """Number of tokens the engine sampled (`response_masks.sum()`)."""
        return int(self.response_masks.sum())


@dataclass
class Step:
    """One turn of a multi-turn trajectory.

    Attributes:
        chat_completions: the full conversation up to and including this step's assistant message.
        thought: the text inside `<think>...</think>` of the model response, or "".
        action: the raw content of the tool call(s) the model made this turn, or "" for a final answer.
        observation: what the model saw before acting: the user question on turn 0, later the previous
            action's result.
        model_response: the full assistant text of this turn.
        info: details of this turn: finish reason, sampled token count, weight version, `llm_time_s` and
            `env_time_s` (seconds in the engine and in the environment), tool-call counts and errors.
        reward: step reward.
        done: True on the step that ended the trajectory.
        mc_return: discounted return from this step on (filled by training code).
        prompt_ids: the exact prompt ids of this step, when the trajectory is not one continuous token sequence
            (server capture, memory that rewrites history); [] otherwise.
        response_ids: the ids the engine sampled in this step, recorded with `prompt_ids`.
        response_logprobs: the engine's logprobs of `response_ids` (nats).
    """

    chat_completions: list[dict[str, str]] = field(default_factory=list)
    thought: str = ""
    action: Any = ""
    observation: Any = ""
    model_response: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    done: bool = False
    mc_return: float = 0.0
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)


@dataclass
class StepTrajectory(Trajectory):
    """A `Trajectory` that also keeps its task and per-turn `Step` records."""

    task: Any = None
    steps: list[Step] = field(default_factory=list)


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    """A JSON-ready record: token ids, masks, logprobs, chat, reward, metrics and termination reason."""
    record: dict[str, Any] = {
        "idx": trajectory.idx,
        "prompt_ids": trajectory.prompt_tokens.tolist(),
        "response_ids": trajectory.response_tokens.tolist(),
        "response_mask": trajectory.response_masks.tolist(),
        "response_logprobs": None if trajectory.response_logprobs is None else trajectory.response_logprobs.tolist(),
        "chat_completions": trajectory.chat_completions,
        "trajectory_reward": trajectory.trajectory_reward,
        "metrics": trajectory.metrics,
        "termination_reason": trajectory.termination_reason,
        "failed": trajectory.failed,
        "error": trajectory.error,
    }
    if isinstance(trajectory, StepTrajectory):
        task = trajectory.task if isinstance(trajectory.task, dict) else {"raw": repr(trajectory.task)}
        record["task_id"] = task.get("id")
        record["steps"] = [
            {"action": s.action, "thought": s.thought, "reward": s.reward, "done": s.done, "info": s.info}
            for s in trajectory.steps
        ]
    return record


def trajectory_from_dict(record: Mapping[str, Any]) -> Trajectory:
    """The `Trajectory` a `trajectory_to_dict` record holds (e.g. read back from `trajectories.jsonl`): token ids,
    mask, logprobs, chat, reward, metrics and outcome. Per-turn steps and the task are not restored.

    Raises:
        TrajectoryError: if a field is missing or the token fields are inconsistent.
    """
    try:
        return Trajectory(
            prompt_tokens=record["prompt_ids"], response_tokens=record["response_ids"],
            response_masks=record["response_mask"], idx=record["idx"], trajectory_reward=record["trajectory_reward"],
            chat_completions=record["chat_completions"], metrics=record["metrics"],
            response_logprobs=record["response_logprobs"], termination_reason=record["termination_reason"],
            failed=record["failed"], error=record["error"],
        )  # fmt: skip
    except KeyError as exc:
        raise TrajectoryError(f"a trajectory record needs {exc.args[0]!r}") from None
