"""GRPO trainer: packed trajectories -> one optimizer step on the training model -> weights for the engines."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
from pydantic import Field

from agentic_rl.config import Config
from agentic_rl.errors import TrainingError
from agentic_rl.train.advantages import batch_advantages
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.loss import grpo_loss, response_logprobs
from agentic_rl.train.optim import adamw, load_optimizer_state
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.types import Trajectory

__all__ = ["GRPOConfig", "GRPOTrainer"]

logger = logging.getLogger(__name__)


class GRPOConfig(Config):
    """Optimizer and loss settings.

    Attributes:
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        clip_low / clip_high: ratio clip range of the policy loss.
        clip_ratio_c: dual-clip bound (> 1) on the ratio of negative-advantage tokens (Ye et al. 2020; see
            `grpo_loss`).
        kl_coef: weight of the k3 KL to the reference (the model at the start of training); 0 = no reference.
        loss_agg_mode: `token-mean` or `sequence-mean` (a trajectory's runs form one sequence).
        scale_by_std: GRPO's division by the group std (False: mean baseline only).
        std_floor: floor on the group std.
        max_grad_norm: gradient clipping norm.
        micro_batch_size: rows per forward/backward (gradients are accumulated over the batch); with
            `sequence-mean` a trajectory's runs stay in one micro-batch, which may then hold more rows.
        max_prompt_length / max_response_length: packing widths in tokens (None: the longest in the batch). A run
            whose prompt is longer is left out; a longer response keeps its first tokens. Cut sampled tokens are
            counted in `tokens_excluded_over_length`.
        max_consecutive_skips: `train_step` raises `TrainingError` when this many optimizer steps in a row were
            skipped for a non-finite gradient norm.
    """

    lr: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.2, ge=0)
    clip_ratio_c: float = Field(default=3.0, gt=1)
    kl_coef: float = Field(default=0.0, ge=0)
    loss_agg_mode: Literal["token-mean", "sequence-mean"] = "token-mean"
    scale_by_std: bool = True
    std_floor: float = Field(default=0.1, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=4, ge=1)
    max_prompt_length: int | None = Field(default=None, ge=1)
    max_response_length: int | None = Field(default=None, ge=1)
    max_consecutive_skips: int = Field(default=3, ge=1)


def _micro_batches(
    rows: torch.Tensor, owner: torch.Tensor, size: int, *, whole_trajectories: bool
) -> list[torch.Tensor]:
    """Split row indices into chunks of at most `size` rows; with `whole_trajectories`, a trajectory's rows
    (same `owner`) are never split (a chunk may then exceed `size`)."""
    if not rows.numel():
        return []
    if not whole_trajectories:
        return list(torch.split(rows, size))
    chunks: list[list[int]] = [[]]
    owners = owner[rows].tolist()
    for start, row in enumerate(rows.tolist()):
        if start and owners[start] == owners[start - 1]:
            chunks[-1].append(row)
            continue
        span = owners.count(owners[start])
        if chunks[-1] and len(chunks[-1]) + span > size:
            chunks.append([])
        chunks[-1].append(row)
    return [torch.tensor(c, dtype=torch.long, device=rows.device) for c in chunks]


class GRPOTrainer:
    """Owns the training model and its optimizer.

    Args:
        model: a `transformers` causal LM (fp32 recommended on the CPU), or a DDP wrapper of one.
        pad_token_id: padding id for packing.
        config: optimizer and loss settings.
        reference: a frozen copy of the initial model for the KL term (built when `kl_coef > 0` and None).
        dist: the data-parallel context under torchrun; gradients are averaged across its ranks.

    Attributes:
        steps_done: `train_step` calls so far.
        skipped_steps: optimizer steps skipped so far for a non-finite gradient norm.
        consecutive_skips: skips since the last optimizer step that was taken.
    """

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, config: GRPOConfig | None = None,
                 reference: torch.nn.Module | None = None, dist: DistContext | None = None) -> None:  # fmt: skip
        self.model = model
        self.dist = dist
        if dist is not None:
            dist.broadcast_params_(model)  # identical start on every rank
        self.config = config or GRPOConfig()
        self.pad_token_id = pad_token_id
        self.optimizer = adamw(model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)
        if self.config.kl_coef > 0 and reference is None:
            import copy

            reference = copy.deepcopy(self.module).eval().requires_grad_(False)
        self.reference = reference
        self.steps_done = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0

    @property
    def module(self) -> torch.nn.Module:
        """The underlying model (unwrapped from DDP)."""
        return getattr(self.model, "module", self.model)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs besides the weights: the optimizer's state and the step counters."""
        return {"optimizer": self.optimizer.state_dict(), "steps_done": self.steps_done,
                "skipped_steps": self.skipped_steps, "consecutive_skips": self.consecutive_skips}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (the model's weights are loaded separately).

        Raises:
            ValueError: from the optimizer, if its saved parameter groups do not fit this model's.
        """
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.steps_done = int(state["steps_done"])
        self.skipped_steps = int(state["skipped_steps"])
        self.consecutive_skips = int(state["consecutive_skips"])

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """`(name, tensor)` pairs to push into an engine (`VLLMEngine.update_weights`)."""
        return [(name, p.detach()) for name, p in self.module.named_parameters()]

    def train_step(
        self, trajectories: Sequence[Trajectory], *, group_ids: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """One GRPO optimizer step on a rollout: every exact token run of every valid trajectory is trained.

        A trajectory whose history memory rewrote trains each of its runs, each on its own prompt, all with the
        trajectory's advantage (`pack_trajectories`, `batch_advantages`). If the gradient norm is not finite, the
        optimizer step is skipped (weights unchanged) and reported in `step_skipped` / `skipped_steps`.

        Args:
            trajectories: the rollout; rows of one task share a group (by `task["id"]`, or `group_ids`).
            group_ids: explicit group of each trajectory.

        Returns:
            Metrics: `loss`, `pg_loss`, `kl`, `clip_fraction` (share of trained tokens any clip cut off),
            `dual_clip_fraction`, `kl_clamp_fraction`, `grad_norm`, `reward_mean` / `reward_std` (over valid
            trajectories), `valid_trajectories`, `valid_rows` (trained runs), `zero_advantage_rows` (of those,
            rows whose forward was skipped: advantage 0 and no KL term add exactly nothing to the gradient),
            `response_length` (mean sampled tokens per valid trajectory, all runs), `tokens` (= `tokens_trained`),
            the token accounting of `TokenCounts` (`tokens_sampled` == `tokens_trained` + `tokens_excluded`, and
            `tokens_excluded_failed`, `tokens_excluded_aborted`, `tokens_excluded_over_length`), `logprob_diff`
            (mean |trainer - engine| logprob before the update, over the rows computed, nats; None when no row was
            computed, e.g. every group's rewards were equal), `step_skipped` (1 if the optimizer step was skipped),
            `skipped_steps` (so far) and `train_seconds`.

        Raises:
            TrainingError: when `max_consecutive_skips` optimizer steps in a row were skipped (the weights no longer
                move: the model or the data produce non-finite gradients).
            TrajectoryError: from packing or the loss (inconsistent records, NaN/Inf inputs).
        """
        t0 = time.perf_counter()
        cfg = self.config
        device = next(self.module.parameters()).device
        batch = pack_trajectories(trajectories, pad_token_id=self.pad_token_id, group_ids=group_ids, device=device,
                                  max_prompt_length=cfg.max_prompt_length, max_response_length=cfg.max_response_length)  # fmt: skip
        advantages = batch_advantages(batch, scale_by_std=cfg.scale_by_std, std_floor=cfg.std_floor)
        rows = torch.nonzero(batch.valid & (batch.response_mask.sum(-1) > 0)).flatten()
        total_tokens = float(batch.response_mask[rows].sum())
        total_sequences = int(torch.unique(batch.row_trajectory[rows]).numel())
        with_kl = self.reference is not None and cfg.kl_coef > 0
        # Without a KL term a row whose advantage is 0 adds exactly 0 to the loss and its gradient: skip its forward.
        # The normalizers above still count it, so the step is the same as with the row.
        computed = rows if with_kl else rows[advantages[rows] != 0]
        zero_advantage_rows = int(rows.numel() - computed.numel())
        computed_tokens = float(batch.response_mask[computed].sum())
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "pg_loss", "kl", "clip_fraction", "dual_clip_fraction", "kl_clamp_fraction",
                              "diff"), 0.0)  # fmt: skip
        chunks = _micro_batches(computed, batch.row_trajectory, cfg.micro_batch_size,
                                whole_trajectories=cfg.loss_agg_mode == "sequence-mean")  # fmt: skip
        for i, idx in enumerate(chunks):
            micro = batch.select(idx, trim=True)
            sync = i == len(chunks) - 1
            context = self.model.no_sync() if (hasattr(self.model, "no_sync") and not sync) else nullcontext()
            with context:
                new = response_logprobs(self.model, micro)
                ref = None
                if with_kl:
                    with torch.no_grad():
                        ref = response_logprobs(self.reference, micro)
                out = grpo_loss(new, micro.old_logprobs, advantages[idx], micro.response_mask,
                                clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_ratio_c=cfg.clip_ratio_c,
                                ref_logprobs=ref, kl_coef=cfg.kl_coef, loss_agg_mode=cfg.loss_agg_mode,
                                sequence_ids=micro.row_trajectory)  # fmt: skip
                token_share = float(micro.response_mask.sum()) / total_tokens
                weight = (token_share if cfg.loss_agg_mode == "token-mean"
                          else int(torch.unique(micro.row_trajectory).numel()) / total_sequences)  # fmt: skip
                (out.loss * weight).backward()
            mask = micro.response_mask.bool()
            sums["diff"] += float((new.detach() - micro.old_logprobs).abs()[mask].sum())
            for key in ("loss", "pg_loss", "kl"):
                sums[key] += float(getattr(out, key).detach()) * weight
            for key in ("clip_fraction", "dual_clip_fraction", "kl_clamp_fraction"):  # token shares in every mode
                sums[key] += float(getattr(out, key)) * token_share
        if rows.numel() and not computed.numel():  # every row skipped: the optimizer still steps on a zero gradient
            for p in self.module.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        if self.dist is not None:
            self.dist.allreduce_grads_(self.module)  # every rank joins, even with no rows of its own
        has_grads = any(p.grad is not None for p in self.module.parameters())
        grad_norm = (float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), cfg.max_grad_norm))
                     if has_grads else 0.0)  # fmt: skip
        skipped = has_grads and not math.isfinite(grad_norm)  # the norm is global: every rank decides alike
        if skipped:
            self.skipped_steps += 1
            self.consecutive_skips += 1
            logger.warning("non-finite gradient norm %s: optimizer step skipped (%d in a row, %d so far)", grad_norm,
                           self.consecutive_skips, self.skipped_steps)  # fmt: skip
        elif has_grads:
            self.optimizer.step()
            self.consecutive_skips = 0
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        if self.consecutive_skips >= cfg.max_consecutive_skips:
            raise TrainingError(
                f"{self.consecutive_skips} optimizer steps in a row were skipped for a non-finite gradient norm "
                f"(last: {grad_norm}; max_consecutive_skips={cfg.max_consecutive_skips}): the weights no longer move"
            )
        valid_rewards = batch.trajectory_rewards[batch.trajectory_valid]
        valid_lengths = batch.trajectory_tokens[batch.trajectory_valid].float()
        return {
            **{k: v for k, v in sums.items() if k != "diff"},
            "grad_norm": grad_norm,
            "reward_mean": float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
            "reward_std": float(valid_rewards.std(unbiased=False)) if valid_rewards.numel() else 0.0,
            "valid_trajectories": int(batch.trajectory_valid.sum()),
            "valid_rows": int(rows.numel()),
            "zero_advantage_rows": zero_advantage_rows,
            "response_length": float(valid_lengths.mean()) if valid_lengths.numel() else 0.0,
            "tokens": int(total_tokens),
            **batch.tokens.as_metrics(),
            "logprob_diff": sums["diff"] / computed_tokens if computed_tokens else None,
            "step_skipped": int(skipped),
            "skipped_steps": self.skipped_steps,
            "train_seconds": time.perf_counter() - t0,
        }
