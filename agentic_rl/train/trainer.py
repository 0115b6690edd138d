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
from agentic_rl.train.advantages import group_advantages
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.loss import grpo_loss, response_logprobs
from agentic_rl.train.packing import PackedBatch, pack_trajectories
from agentic_rl.types import Trajectory

__all__ = ["GRPOConfig", "GRPOTrainer"]

logger = logging.getLogger(__name__)


class GRPOConfig(Config):
    """Optimizer and loss settings.

    Attributes:
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        clip_low / clip_high: ratio clip range of the policy loss.
        kl_coef: weight of the k3 KL to the reference (the model at the start of training); 0 = no reference.
        loss_agg_mode: `token-mean` or `sequence-mean`.
        scale_by_std: GRPO's division by the group std (False: mean baseline only).
        std_floor: floor on the group std.
        max_grad_norm: gradient clipping norm.
        micro_batch_size: rows per forward/backward (gradients are accumulated over the batch).
    """

    lr: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.2, ge=0)
    kl_coef: float = Field(default=0.0, ge=0)
    loss_agg_mode: Literal["token-mean", "sequence-mean"] = "token-mean"
    scale_by_std: bool = True
    std_floor: float = Field(default=0.1, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=4, ge=1)


def _rows(batch: PackedBatch, idx: torch.Tensor) -> PackedBatch:
    fields = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()}
    return PackedBatch(**fields)


class GRPOTrainer:
    """Owns the training model and its optimizer.

    Args:
        model: a `transformers` causal LM (fp32 recommended on the CPU), or a DDP wrapper of one.
        pad_token_id: padding id for packing.
        config: optimizer and loss settings.
        reference: a frozen copy of the initial model for the KL term (built when `kl_coef > 0` and None).
        dist: the data-parallel context under torchrun; gradients are averaged across its ranks.
    """

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, config: GRPOConfig | None = None,
                 reference: torch.nn.Module | None = None, dist: DistContext | None = None) -> None:  # fmt: skip
        self.model = model
        self.dist = dist
        if dist is not None:
            dist.broadcast_params_(model)  # identical start on every rank
        self.config = config or GRPOConfig()
        self.pad_token_id = pad_token_id
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=self.config.lr,
            weight_decay=self.config.weight_decay,
        )  # fmt: skip
        if self.config.kl_coef > 0 and reference is None:
            import copy

            reference = copy.deepcopy(self.module).eval().requires_grad_(False)
        self.reference = reference
        self.steps_done = 0

    @property
    def module(self) -> torch.nn.Module:
        """The underlying model (unwrapped from DDP)."""
        return getattr(self.model, "module", self.model)

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """`(name, tensor)` pairs to push into an engine (`VLLMEngine.update_weights`)."""
        return [(name, p.detach()) for name, p in self.module.named_parameters()]

    def train_step(self, trajectories: Sequence[Trajectory], *, group_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """One GRPO optimizer step on a rollout.

        Args:
            trajectories: the rollout; rows of one task share a group (by `task["id"]`, or `group_ids`).
            group_ids: explicit group of each trajectory.

        Returns:
            Metrics: `loss`, `pg_loss`, `kl`, `clip_fraction`, `grad_norm`, `reward_mean`, `reward_std`,
            `valid_rows`, `response_length` (mean sampled tokens), `tokens`, `logprob_diff` (mean |trainer - engine|
            logprob before the update, nats) and `train_seconds`.
        """
        t0 = time.perf_counter()
        device = next(self.module.parameters()).device
        batch = pack_trajectories(trajectories, pad_token_id=self.pad_token_id, group_ids=group_ids, device=device)
        advantages = group_advantages(batch.rewards, batch.group_ids, batch.valid, scale_by_std=self.config.scale_by_std,
                                      std_floor=self.config.std_floor)  # fmt: skip
        rows = torch.nonzero(batch.valid & (batch.response_mask.sum(-1) > 0)).flatten()
        total_tokens = float(batch.response_mask[rows].sum())
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "diff": 0.0}
        chunks = list(torch.split(rows, self.config.micro_batch_size)) if rows.numel() else []
        for i, idx in enumerate(chunks):
            micro = _rows(batch, idx)
            sync = i == len(chunks) - 1
            context = self.model.no_sync() if (hasattr(self.model, "no_sync") and not sync) else nullcontext()
            with context:
                new = response_logprobs(self.model, micro)
                ref = None
                if self.reference is not None and self.config.kl_coef > 0:
                    with torch.no_grad():
                        ref = response_logprobs(self.reference, micro)
                out = grpo_loss(new, micro.old_logprobs, advantages[idx], micro.response_mask,
                                clip_low=self.config.clip_low, clip_high=self.config.clip_high, ref_logprobs=ref,
                                kl_coef=self.config.kl_coef, loss_agg_mode=self.config.loss_agg_mode)  # fmt: skip
                weight = (float(micro.response_mask.sum()) / total_tokens if self.config.loss_agg_mode == "token-mean"
                          else idx.numel() / rows.numel())  # fmt: skip
                (out.loss * weight).backward()
            mask = micro.response_mask.bool()
            sums["diff"] += float((new.detach() - micro.old_logprobs).abs()[mask].sum())
            for key in ("loss", "pg_loss", "kl", "clip_fraction"):
                sums[key] += float(getattr(out, key).detach()) * weight
        if self.dist is not None:
            self.dist.allreduce_grads_(self.module)  # every rank joins, even with no rows of its own
        has_grads = any(p.grad is not None for p in self.module.parameters())
        grad_norm = (float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.config.max_grad_norm))
                     if has_grads else 0.0)  # fmt: skip
        if has_grads and math.isfinite(grad_norm):
            self.optimizer.step()
        elif has_grads:
            logger.warning("non-finite gradient norm %s: optimizer step skipped", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        valid_rewards = batch.rewards[batch.valid]
        return {
            **{k: v for k, v in sums.items() if k != "diff"},
            "grad_norm": grad_norm,
            "reward_mean": float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
            "reward_std": float(valid_rewards.std(unbiased=False)) if valid_rewards.numel() else 0.0,
            "valid_rows": int(batch.valid.sum()),
            "response_length": float(batch.response_lengths[batch.valid].float().mean()) if rows.numel() else 0.0,
            "tokens": int(total_tokens),
            "logprob_diff": sums["diff"] / total_tokens if total_tokens else 0.0,
            "train_seconds": time.perf_counter() - t0,
        }
