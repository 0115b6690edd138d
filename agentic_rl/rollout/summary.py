"""Aggregate statistics of a rollout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentic_rl.parser import LLAMA3_JSON, ToolCall, parse_tool_calls
from agentic_rl.rollout.retries import failure_counts
from agentic_rl.types import Trajectory

__all__ = ["summarize"]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(
    trajectories: Sequence[Trajectory], wall_time_s: float, *, earlier: Sequence[Trajectory] = ()
) -> dict[str, Any]:
    """Rollout statistics.

    Args:
        trajectories: the finished rollout.
        wall_time_s: wall-clock seconds of the whole rollout.
        earlier: trajectories an interrupted run of the same rollout finished before (read back from its
            records); counted in every statistic except the throughput, which `wall_time_s` did not time.

    Returns:
        `tasks`, `failed`, `failed_<kind>` and `retries_<kind>` for each `FailureKind` (`rollout.retries.failure_counts`:
        what still failed outside the policy, and the retries made), `accuracy` (share of all tasks with `res_reward > 0`), `mean_task_reward` (mean
        `res_reward` of finished trajectories: the task reward without format bonuses, e.g. answer F1),
        `tool_call_rate` (share of finished trajectories with at least one tool call), `tool_call_rates` (per tool
        name: share of finished trajectories whose assistant turns call it, as `parse_tool_calls` reads them),
        `mean_turns`, `generated_tokens`, `generated_tokens_per_s` (of
        `trajectories` only), `llm_time_s` / `env_time_s` / `reward_time_s` (summed over trajectories),
        `alignment_mismatches`, `retokenize_drift`, `template_runs` and `rerendered_prompt_tokens` (summed: the runs
        a chat template that rewrites history started, and their prompt tokens), `termination_reasons` (counts), `wall_time_s` and `resumed`
        (the number of `earlier` trajectories).
    """
    timed = sum(t.num_generated_tokens for t in trajectories)
    trajectories = [*earlier, *trajectories]
    ok = [t for t in trajectories if not t.failed]
    generated = sum(t.num_generated_tokens for t in trajectories)
    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.termination_reason] = reasons.get(t.termination_reason, 0) + 1
    n = len(trajectories)
    return {
        "tasks": n,
        "failed": n - len(ok),
        **failure_counts(trajectories),
        "accuracy": sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories) / n if n else 0.0,
        "mean_reward": _mean([float(t.trajectory_reward) for t in ok]),
        "mean_task_reward": _mean([float(t.metrics.get("res_reward", 0.0)) for t in ok]),
        "tool_call_rate": _mean([float(t.metrics.get("tool_calls", 0) > 0) for t in ok]),
        "tool_call_rates": _tool_call_rates(ok),
        "mean_turns": _mean([t.metrics.get("steps", 0) for t in ok]),
        "generated_tokens": generated,
        "generated_tokens_per_s": timed / wall_time_s if wall_time_s > 0 else 0.0,
        "llm_time_s": sum(t.metrics.get("llm_time", 0.0) for t in trajectories),
        "env_time_s": sum(t.metrics.get("env_time", 0.0) for t in trajectories),
        "reward_time_s": sum(t.metrics.get("reward_time", 0.0) for t in trajectories),
        "alignment_mismatches": sum(t.metrics.get("alignment_mismatches", 0) for t in ok),
        "retokenize_drift": sum(t.metrics.get("retokenize_drift", 0) for t in ok),
        "template_runs": sum(t.metrics.get("template_runs", 0) for t in trajectories),
        "rerendered_prompt_tokens": sum(t.metrics.get("rerendered_prompt_tokens", 0) for t in trajectories),
        "termination_reasons": reasons,
        "wall_time_s": wall_time_s,
        "resumed": len(earlier),
    }


def _tool_call_rates(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    called: dict[str, int] = {}
    for t in trajectories:
        names = {
            call.name
            for message in t.chat_completions
            if message.get("role") == "assistant"
            for call in parse_tool_calls(str(message.get("content") or ""), call_format=LLAMA3_JSON)
            if isinstance(call, ToolCall)
        }
        for name in names:
            called[name] = called.get(name, 0) + 1
    return {name: count / len(trajectories) for name, count in sorted(called.items())}
