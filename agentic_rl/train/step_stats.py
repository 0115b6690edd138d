"""What one GRPO optimizer step reports: its micro-batches' loss sums and the metrics `GRPOTrainer.train_step` returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from agentic_rl.train.loss import LossOutput
from agentic_rl.train.off_policy import lag_sums
from agentic_rl.train.packing import PackedBatch, TokenCounts
from agentic_rl.train.step_rows import StepRows

__all__ = ["LossSums", "StepStats"]


@dataclass(slots=True)
class LossSums:
    """`LossOutput`'s scalars summed over this rank's micro-batches of a step, weighted into this rank's means.

    Attributes:
        loss, pg_loss, kl: each micro-batch's value (normalized by the step's global count, `grpo_loss`'s
            `normalizer`) times the weight `add` is given, which makes the sum this rank's own mean over its
            response tokens (`token-mean`) or sequences (`sequence-mean`).
        clip_fraction, dual_clip_fraction, kl_clamp_fraction: weighted by the micro-batch's share of this rank's
            response tokens (they are shares of tokens in every mode).
        logprob_gap: |trainer - engine| logprob summed over the computed response tokens (nats), unweighted.
        is_weight_sum: the importance weight w = pi_prox / pi_behav before truncation summed over the computed
            response tokens, unweighted; `is_weight_max` its max (None before any token).
        is_truncated_fraction, is_masked_fraction: weighted like `clip_fraction`.
        lag_gap: `{lag: (sum of |trainer - engine| logprob (nats), tokens)}` over the computed response tokens whose
            weight version is known (`off_policy.lag_sums`).
    """

    loss: float = 0.0
    pg_loss: float = 0.0
    kl: float = 0.0
    clip_fraction: float = 0.0
    dual_clip_fraction: float = 0.0
    kl_clamp_fraction: float = 0.0
    logprob_gap: float = 0.0
    is_weight_sum: float = 0.0
    is_weight_max: float | None = None
    is_truncated_fraction: float = 0.0
    is_masked_fraction: float = 0.0
    lag_gap: dict[int, tuple[float, int]] = field(default_factory=dict)

    def add(
        self,
        out: LossOutput,
        gap: torch.Tensor,
        *,
        weight: float,
        token_share: float,
        lag_gap: dict[int, tuple[float, int]] | None = None,
    ) -> None:
        """Add one micro-batch.

        Args:
            out: its loss.
            gap: (n,) float32 |trainer - engine| logprob (nats) of its n response tokens, detached.
            weight: the factor of its `loss`, `pg_loss` and `kl` (see `loss`).
            token_share: its share of this rank's response tokens.
            lag_gap: its `{lag: (gap sum, tokens)}` (`off_policy.lag_sums`); None: no versions known.
        """
        self.logprob_gap += float(gap.sum())
        self.is_weight_sum += float(out.is_weight_mean) * gap.numel()
        if gap.numel():
            peak = float(out.is_weight_max)
            self.is_weight_max = peak if self.is_weight_max is None else max(self.is_weight_max, peak)
        self.is_truncated_fraction += float(out.is_truncated_fraction) * token_share
        self.is_masked_fraction += float(out.is_masked_fraction) * token_share
        for lag, (total, count) in (lag_gap or {}).items():
            before = self.lag_gap.get(lag, (0.0, 0))
            self.lag_gap[lag] = (before[0] + total, before[1] + count)
        self.loss += float(out.loss.detach()) * weight
        self.pg_loss += float(out.pg_loss.detach()) * weight
        self.kl += float(out.kl.detach()) * weight
        self.clip_fraction += float(out.clip_fraction) * token_share
        self.dual_clip_fraction += float(out.dual_clip_fraction) * token_share
        self.kl_clamp_fraction += float(out.kl_clamp_fraction) * token_share


@dataclass(frozen=True, slots=True)
class StepStats:
    """The metrics of one `GRPOTrainer.train_step`, one attribute per key of `as_metrics` (in its order).

    Attributes:
        loss, pg_loss, kl: the loss, its policy-gradient part and its mean k3 KL (see `grpo_loss`) over this rank's
            rows: under torchrun each rank reports its own, while the gradient is that of the mean over every
            rank's rows.
        clip_fraction: share of this rank's trained tokens any clip cut off.
        dual_clip_fraction: share of this rank's trained tokens the dual clip alone cut off.
        kl_clamp_fraction: share of this rank's trained tokens whose KL log-ratio was clamped.
        grad_norm: total norm of the (all ranks') gradient before clipping (0.0 without gradients; may be
            non-finite).
        lr: the schedule's learning rate for this step (`GRPOConfig.lr_schedule`): the rate of its update, if one
            was taken (a skipped step, or one without gradients, updates nothing but still moves the schedule on).
        reward_mean, reward_std: over valid trajectories (population std; 0.0 without any).
        valid_trajectories: trajectories that enter the loss and the group statistics (overlong-filtered ones enter
            only the statistics, `GRPOConfig.overlong_filter`).
        valid_rows: trained rows with response tokens: runs, or steps with `advantage: step`.
        zero_advantage_rows: of those, rows whose forward was skipped (advantage 0 and no KL term add exactly nothing
            to the gradient).
        response_length: mean sampled tokens per valid trajectory, all runs (0.0 without any).
        tokens: response tokens trained (= `tokens_trained`).
        token_counts: the token accounting, reported as its `TokenCounts.as_metrics` keys (`tokens_sampled` ==
            `tokens_trained` + `tokens_excluded`, and `tokens_excluded_failed`, `tokens_excluded_aborted`, `tokens_excluded_refused`,
            `tokens_excluded_over_length`, `tokens_excluded_overlong`).
        logprob_diff: mean |trainer - engine| logprob before the update over the rows computed (nats); None when no
            row was computed (e.g. every group's rewards were equal).
        step_skipped: 1 if the optimizer step was skipped for a non-finite gradient norm.
        skipped_steps: optimizer steps skipped so far.
        train_seconds: wall time of the step.
        lag_tokens: `{lag: trained tokens}`, lag = the trainer's weight version (`train_step`'s `weight_version`)
            minus the version that sampled the token, over this rank's trained tokens whose version is known; empty
            when `weight_version` is None or no version was recorded.
        lag_logprob_gap: `{lag: mean |trainer - engine| logprob (nats)}` over the computed tokens of each lag (a lag
            whose tokens were all in skipped rows is absent); empty like `lag_tokens`.
        is_weight_mean, is_weight_max: mean and max of the importance weight w = pi_prox / pi_behav before
            truncation or masking (`off_policy.importance_weights`) over the computed tokens; None when no row was
            computed.
        is_truncated_fraction: share of this rank's trained tokens whose weight `tis` truncated.
        is_masked_fraction: share of this rank's trained tokens `mask` gave weight 0 (they stay in `tokens_trained`
            and in the loss's token or sequence count: they entered the batch, each adding 0).
    """

    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    dual_clip_fraction: float
    kl_clamp_fraction: float
    grad_norm: float
    lr: float
    reward_mean: float
    reward_std: float
    valid_trajectories: int
    valid_rows: int
    zero_advantage_rows: int
    response_length: float
    tokens: int
    token_counts: TokenCounts
    logprob_diff: float | None
    step_skipped: int
    skipped_steps: int
    train_seconds: float
    lag_tokens: dict[int, int]
    lag_logprob_gap: dict[int, float]
    is_weight_mean: float | None
    is_weight_max: float | None
    is_truncated_fraction: float
    is_masked_fraction: float

    def as_metrics(self) -> dict[str, Any]:
        """`{key: value}` in attribute order, `token_counts` spread into its own keys."""
        metrics: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            metrics.update(value.as_metrics() if isinstance(value, TokenCounts) else {item.name: value})
        return metrics

    @classmethod
    def of(
        cls,
        batch: PackedBatch,
        step: StepRows,
        sums: LossSums,
        *,
        grad_norm: float,
        lr: float,
        skipped: bool,
        skipped_steps: int,
        t0: float,
        weight_version: int | None,
        outcome: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> StepStats:
        """The metrics of a step that trained `step`'s rows of `batch`; `t0` is its `time.perf_counter()` start,
        `weight_version` the trainer's version, `skipped_steps` the trainer's count so far, `outcome` the valid
        trajectories' rewards and lengths when the batch's rows are steps (`GRPOTrainer._pack`)."""
        mask = batch.response_mask[step.rows]
        lag_tokens = lag_sums(mask, batch.weight_versions[step.rows], mask, weight_version)
        if outcome is None:
            valid_rewards = batch.trajectory_rewards[batch.trajectory_valid]
            valid_lengths = batch.trajectory_tokens[batch.trajectory_valid].float()
        else:
            valid_rewards, valid_lengths = outcome
        return cls(
            loss=sums.loss,
            pg_loss=sums.pg_loss,
            kl=sums.kl,
            clip_fraction=sums.clip_fraction,
            dual_clip_fraction=sums.dual_clip_fraction,
            kl_clamp_fraction=sums.kl_clamp_fraction,
            grad_norm=grad_norm,
            lr=lr,
            reward_mean=float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
            reward_std=float(valid_rewards.std(unbiased=False)) if valid_rewards.numel() else 0.0,
            valid_trajectories=int(valid_rewards.numel()),
            valid_rows=int(step.rows.numel()),
            zero_advantage_rows=int(step.rows.numel() - step.computed.numel()),
            response_length=float(valid_lengths.mean()) if valid_lengths.numel() else 0.0,
            tokens=int(step.total_tokens),
            token_counts=batch.tokens,
            logprob_diff=sums.logprob_gap / step.computed_tokens if step.computed_tokens else None,
            step_skipped=int(skipped),
            skipped_steps=skipped_steps,
            train_seconds=time.perf_counter() - t0,
            lag_tokens={lag: count for lag, (_, count) in lag_tokens.items()},
            lag_logprob_gap={lag: total / count for lag, (total, count) in sorted(sums.lag_gap.items())},
            is_weight_mean=sums.is_weight_sum / step.computed_tokens if step.computed_tokens else None,
            is_weight_max=sums.is_weight_max,
            is_truncated_fraction=sums.is_truncated_fraction,
            is_masked_fraction=sums.is_masked_fraction,
        )
