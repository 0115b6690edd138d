"""The metrics row of a training step: which keys it has, in which order, and how each combines the ranks' values.

`agentic_rl.loop` fills a row after every step (`metrics_row`); every rank gathers the same keys in the same
order, so a row is the same on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.rollout.retries import failure_counts
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.packing import TokenCounts
from agentic_rl.train.step_stats import StepStats
from agentic_rl.types import FailureKind, Trajectory

__all__ = [
    "HELDOUT_COUNTS",
    "TOKEN_KEYS",
    "StepFigures",
    "gather",
    "heldout_pass_figures",
    "heldout_pass_keys",
    "metrics_row",
    "row_sources",
    "sampled_figures",
    "standard_error",
]

# Token accounting of a training step (`TokenCounts`), summed over ranks in each metrics row.
# `tokens_excluded_constant`: the tokens of groups dynamic sampling left out, which never reach the trainer.
TOKEN_KEYS = (
    "tokens_sampled",
    "tokens_trained",
    "tokens_excluded",
    "tokens_excluded_failed",
    "tokens_excluded_aborted",
    "tokens_excluded_refused",
    "tokens_excluded_over_length",
    "tokens_excluded_overlong",
    "tokens_excluded_constant",
)
# The held-out evaluation's counts, summed over ranks.
HELDOUT_COUNTS = ("solved", "with_tool_calls", "turns", "trajectories")


def heldout_pass_keys(samples: int) -> tuple[str, ...]:
    """The held-out evaluation's per-task sums with `samples` (K) samples per task, summed over ranks: the tasks,
    the sum of their accuracies (c / K each) and of its squares, and the sum of their pass@k for k = 1..K."""
    return ("tasks", "task_accuracy", "task_accuracy_squares", *(f"pass@{k}" for k in range(1, samples + 1)))


def _measured_mean(values: Sequence[float]) -> float | None:
    """The mean over the ranks that measured the value (NaN: not measured); None when none did."""
    measured = [v for v in values if not math.isnan(v)]
    return sum(measured) / len(measured) if measured else None


def _measured_max(values: Sequence[float]) -> float | None:
    measured = [v for v in values if not math.isnan(v)]
    return max(measured) if measured else None


# How each gathered value of a metrics row combines the ranks' values.
_ACROSS_RANKS: dict[str, Callable[[Sequence[float]], Any]] = {
    "mean": lambda values: sum(values) / len(values),
    "sum": sum,
    "count": lambda values: int(sum(values)),
    "measured": _measured_mean,
    "max": _measured_max,
}


def row_sources(max_staleness: int) -> dict[str, str]:
    """A metrics row's keys in order, and where each comes from: gathered from every rank (a rule of
    `_ACROSS_RANKS`); "local": this rank's GRPO step (rank 0's row is the one logged); "run": the step, the
    engine's weight version, the trajectories of all ranks, the staleness bound. Lag keys run from 0 to
    `max_staleness`."""
    lags = range(max_staleness + 1)
    return {
        "step": "run",
        "reward_mean": "mean",
        "reward_std": "mean",
        "accuracy": "mean",
        "failed": "count",
        **{f"failed_{kind}": "count" for kind in FailureKind},
        **{f"retries_{kind}": "count" for kind in FailureKind},
        "refused": "count",
        "loss": "local",
        "pg_loss": "local",
        "kl": "local",
        "grad_norm": "local",
        "lr": "local",
        "clip_fraction": "local",
        "dual_clip_fraction": "local",
        "kl_clamp_fraction": "local",
        "response_length": "mean",
        "entropy": "measured",
        "answer_tokens": "measured",
        "tokens_per_s": "sum",
        "samples_per_s": "sum",
        "rollout_seconds": "mean",
        "train_seconds": "mean",
        "sync_seconds": "mean",
        "step_seconds": "mean",
        "logprob_diff": "measured",
        **dict.fromkeys(TOKEN_KEYS, "count"),
        "is_weight_mean": "measured",
        "is_weight_max": "max",
        "is_truncated_fraction": "measured",
        "is_masked_fraction": "measured",
        **{f"tokens_lag_{lag}": "count" for lag in lags},
        **{f"logprob_gap_lag_{lag}": "measured" for lag in lags},
        "groups_trained": "count",
        "groups_failed": "count",
        "groups_dropped_stale": "count",
        "groups_in_flight": "count",
        "groups_drawn": "count",
        "groups_kept": "count",
        "groups_constant": "count",
        "step_skipped": "local",
        "skipped_steps": "local",
        "zero_advantage_rows": "local",
        "weight_version": "run",
        "max_staleness": "run",
        "trajectories": "run",
    }


def gather(dist: DistContext, keys: Sequence[str], local: Mapping[str, float]) -> dict[str, list[float]]:
    """Every rank's value of each of `keys` (gathered in that order, the same on every rank), in rank order."""
    ranks = dist.gather_floats([local[key] for key in keys])
    return {key: [rk[i] for rk in ranks] for i, key in enumerate(keys)}


def standard_error(count: float, total: float, squares: float) -> float | None:
    """The standard error of a mean from its values' count, sum and sum of squares: sample standard deviation
    (n - 1) / sqrt(n); None for fewer than 2 values."""
    if count < 2:
        return None
    mean = total / count
    return math.sqrt(max(squares - count * mean**2, 0.0) / (count - 1) / count)


def heldout_pass_figures(
    dist: DistContext, correct_by_task: Sequence[Sequence[bool]], samples: int
) -> dict[str, float | None]:
    """The held-out evaluation's figures over K = `samples` samples per task, over the tasks of every rank (each
    rank's per-task sums gathered and summed, `heldout_pass_keys`; every rank calls this, with the same K).

    Args:
        dist: the run's ranks.
        correct_by_task: for each of this rank's tasks, whether each of its K samples is correct
            (`rewards.passk.sample_correct`, as `agentic-rl eval` decides); empty on a rank that evaluated nothing.
        samples: K, the samples per task (>= 1).

    Returns:
        `heldout_pass@k` for k = 1..K (mean over tasks of the unbiased pass@k estimate, `rewards.passk.pass_at_k`),
        `heldout_avg@K` (mean over tasks of the share of correct samples) and `heldout_accuracy_stderr` (the
        standard error over tasks of that share: sample standard deviation / sqrt(tasks); None for fewer than 2
        tasks). All in [0, 1]; 0.0 (stderr None) when no rank evaluated a task.
    """
    from agentic_rl.rewards.passk import task_pass_figures

    rows = [task_pass_figures(correct) for correct in correct_by_task]
    local = {
        "tasks": float(len(rows)),
        "task_accuracy": sum(row["avg@K"] for row in rows),
        "task_accuracy_squares": sum(row["avg@K"] ** 2 for row in rows),
        **{f"pass@{k}": sum(row["pass@k"][str(k)] for row in rows) for k in range(1, samples + 1)},
    }
    totals = {key: sum(values) for key, values in gather(dist, heldout_pass_keys(samples), local).items()}
    tasks = totals["tasks"]
    mean = totals["task_accuracy"] / max(tasks, 1.0)
    stderr = standard_error(tasks, totals["task_accuracy"], totals["task_accuracy_squares"])
    return {
        **{f"heldout_pass@{k}": totals[f"pass@{k}"] / max(tasks, 1.0) for k in range(1, samples + 1)},
        "heldout_avg@K": mean,
        "heldout_accuracy_stderr": stderr,
    }


@dataclass(frozen=True, slots=True)
class StepFigures:
    """What one training step on this rank measured, for its metrics row (built with keywords).

    Attributes:
        trajectories: this rank's trajectories of the step (`group_size` per group).
        refused: records refused for training (`refuse_untrainable`).
        stats: `GRPOTrainer.train_step`'s statistics.
        rollout_s: seconds the step waited for its groups (the whole rollout, in lockstep).
        sync_s: seconds of the weight sync (and waking the engine).
        step_s: seconds from the end of the previous step (or the run's start) to the end of this one.
        groups: counts of this rank's groups: `trained` (some sample not failed), `failed` (every sample failed or
            was refused), `dropped_stale`, `in_flight` (admitted, not trained, at the step's end), and
            `ContinuousRollout.step_counts`: `drawn` (handed to the step), `kept` (the groups that were not idle)
            and `constant` (idle: left out by dynamic sampling, or trained anyway when a step had nothing else;
            0 without).
        task_ids: the task id of each of `trajectories` (None for a task without one).
        left_out: the trajectories of the groups dynamic sampling left out (never trained; their tokens are
            counted in `tokens_excluded_constant`), written to `rollouts/step_K_left_out.jsonl`.
        left_out_task_ids: the task id of each of `left_out`.
    """

    trajectories: list[Trajectory]
    refused: int
    stats: StepStats
    rollout_s: float
    sync_s: float
    step_s: float
    groups: Mapping[str, int]
    task_ids: list[Any]
    left_out: list[Trajectory] = field(default_factory=list)
    left_out_task_ids: list[Any] = field(default_factory=list)


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _local_values(figures: StepFigures, max_staleness: int) -> dict[str, float]:
    """This rank's values of every gathered key."""
    trajectories, stats = figures.trajectories, figures.stats
    generated = sum(t.num_generated_tokens for t in trajectories)
    lags = range(max_staleness + 1)
    return {
        "reward_mean": stats.reward_mean,
        "reward_std": stats.reward_std,
        "accuracy": sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories) / max(len(trajectories), 1),
        "failed": sum(t.failed for t in trajectories),
        **failure_counts(trajectories),
        "refused": figures.refused,
        "response_length": stats.response_length,
        **sampled_figures(trajectories),
        "tokens_per_s": generated / max(figures.step_s, 1e-9),
        "samples_per_s": sum(not t.failed for t in trajectories) / max(figures.step_s, 1e-9),
        "rollout_seconds": figures.rollout_s,
        "train_seconds": stats.train_seconds,
        "sync_seconds": figures.sync_s,
        "step_seconds": figures.step_s,
        "logprob_diff": _nan_if_none(stats.logprob_diff),  # NaN: no row here
        **_token_accounting(stats.token_counts, figures.left_out),
        "is_weight_mean": _nan_if_none(stats.is_weight_mean),
        "is_weight_max": _nan_if_none(stats.is_weight_max),
        "is_truncated_fraction": _nan_if_none(stats.is_truncated_fraction),
        "is_masked_fraction": _nan_if_none(stats.is_masked_fraction),
        **{f"tokens_lag_{lag}": float(stats.lag_tokens.get(lag, 0)) for lag in lags},
        **{f"logprob_gap_lag_{lag}": _nan_if_none(stats.lag_logprob_gap.get(lag)) for lag in lags},
        **{
            f"groups_{key}": float(figures.groups.get(key, 0))
            for key in ("trained", "failed", "dropped_stale", "in_flight", "drawn", "kept", "constant")
        },
    }


def sampled_figures(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """What the policy sampled, over the trajectories that did not fail (NaN where none measured it).

    Returns:
        `entropy`: the per-token entropy of the distribution the engine sampled from (tempered, truncated), in
        nats, estimated as the mean of -log p over every sampled response token: unbiased, since
        E_{x~p}[-log p(x)] = H(p) (the engine records the logprob of that distribution: `logprobs_mode="processed"`).
        `answer_tokens`: the mean tokens of the final turn of the trajectories that end with an answer (a final
        assistant message that calls no tool, `rewards.final_answer_text`), its end-of-turn token included.
    """
    import torch

    from agentic_rl.rewards.answers import final_answer_text

    surprise, sampled, answers = 0.0, 0, []
    for t in trajectories:
        if t.failed:
            continue
        mask = t.response_masks.bool()
        if t.response_logprobs is not None and bool(mask.any()):
            surprise -= float(t.response_logprobs[mask].double().sum())
            sampled += int(mask.sum())
        if final_answer_text(t.chat_completions):
            answers.append(int(torch.cumprod(mask.flip(0).int(), 0).sum()))  # the trailing run of sampled tokens
    return {
        "entropy": surprise / sampled if sampled else math.nan,
        "answer_tokens": sum(answers) / len(answers) if answers else math.nan,
    }


def _token_accounting(counts: TokenCounts, left_out: Sequence[Trajectory]) -> dict[str, int]:
    """The trainer's token accounting with the tokens of the groups dynamic sampling left out added as excluded
    (`tokens_excluded_constant`), so that `tokens_sampled == tokens_trained + tokens_excluded` covers every sampled
    token of the step."""
    left = sum(t.num_generated_tokens for t in left_out)
    tokens = {**dict.fromkeys(TOKEN_KEYS, 0), **counts.as_metrics()}
    tokens["tokens_excluded_constant"] = left
    tokens["tokens_sampled"] += left
    tokens["tokens_excluded"] += left
    return tokens


def metrics_row(
    dist: DistContext, step: int, figures: StepFigures, *, weight_version: int, max_staleness: int
) -> dict[str, Any]:
    """The metrics row of step `step` (0-based), with the keys of `row_sources` in its order.

    It holds the rewards, the accuracy (share of trajectories with a positive task reward) and the failed trajectories,
    the GRPO step's losses, KL, gradient norm and clip fractions, the response length, the sampling entropy and the
    final answers' length (`sampled_figures`), throughput (`tokens_per_s` and
    `samples_per_s`: generated tokens and trajectories trained (not failed) per second of the step, end to end: wait,
    train and sync; summed over ranks. With max_staleness > 0 a step whose groups were ready waits for nothing, so
    single steps vary widely: compare sums over the run) and timings, `logprob_diff` (the engine-trainer logprob gap,
    over the ranks that measured it; None when none did), the step's token accounting summed over ranks
    (`tokens_sampled` = `tokens_trained` + `tokens_excluded`), the off-policy correction's importance weights (`is_*`),
    trained tokens and the engine-trainer logprob gap by version lag (`tokens_lag_j`, `logprob_gap_lag_j`), the groups
    trained, failed, dropped as stale and still in flight, the groups drawn, kept and left out as constant (dynamic
    sampling), `step_skipped` / `skipped_steps`, `zero_advantage_rows`, the weight version, the staleness bound and the
    trajectories.
    """
    sources = row_sources(max_staleness)
    gathered_keys = [key for key, source in sources.items() if source in _ACROSS_RANKS]
    local = _local_values(figures, max_staleness)
    gathered = {key: _ACROSS_RANKS[sources[key]](ranks) for key, ranks in gather(dist, gathered_keys, local).items()}
    own = {
        "step": step + 1,
        "weight_version": weight_version,
        "max_staleness": max_staleness,
        "trajectories": len(figures.trajectories) * dist.world_size,
    }
    local_stats = {key: getattr(figures.stats, key) for key, source in sources.items() if source == "local"}
    values = {"run": own, "local": local_stats, **dict.fromkeys(_ACROSS_RANKS, gathered)}
    return {key: values[source].get(key) for key, source in sources.items()}
