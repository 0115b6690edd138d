"""Supervised fine-tuning on trajectories: masked negative log-likelihood of the tokens the policy produced.

The batch is packed by `pack_trajectories`, the same packing the GRPO step uses, and the loss covers exactly the
tokens with `response_mask == 1` (what the policy writes); prompts, tool observations and template glue are
context only. `SFTProgress` (`agentic_rl.progress.StepProgress`) shows a run's steps to a person.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from agentic_rl.errors import ConfigError
from agentic_rl.progress import StepProgress as SFTProgress
from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.optim import adamw
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.types import Trajectory

__all__ = ["SFTProgress", "SFTTrainer", "masked_nll"]

logger = logging.getLogger(__name__)


def masked_nll(logprobs: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of -log p over masked tokens, and the number of masked tokens.

    Args:
        logprobs: (B, R) float, the model's log-probabilities of the response tokens (nats).
        response_mask: (B, R), 1 where the token is trained.

    Returns:
        `(nll_sum, tokens)`: scalar float tensors; the mean NLL is `nll_sum / tokens`.
    """
    mask = response_mask.to(logprobs.dtype)
    return -(logprobs * mask).sum(), mask.sum()


class SFTTrainer:
    """AdamW on the masked NLL of packed trajectories, accumulated over micro-batches.

    Args:
        model: a `transformers` causal LM (fp32 weights recommended; `bf16_autocast` computes in bfloat16).
        pad_token_id: padding id for packing.
        lr: AdamW learning rate (> 0).
        weight_decay: AdamW weight decay (>= 0).
        micro_batch_size: rows per forward/backward (>= 1).
        max_grad_norm: gradient clipping norm (> 0).
        bf16_autocast: run forward/backward under `torch.autocast(..., dtype=torch.bfloat16)`.

    Raises:
        ConfigError: for an out-of-range argument.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        micro_batch_size: int = 4,
        max_grad_norm: float = 1.0,
        bf16_autocast: bool = False,
    ) -> None:
        if not (lr > 0 and weight_decay >= 0 and micro_batch_size >= 1 and max_grad_norm > 0):
            raise ConfigError(
                f"SFTTrainer needs lr > 0, weight_decay >= 0, micro_batch_size >= 1, max_grad_norm > 0; got lr={lr}, "
                f"weight_decay={weight_decay}, micro_batch_size={micro_batch_size}, max_grad_norm={max_grad_norm}"
            )
        self.model = model
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        self.bf16_autocast = bf16_autocast
        self.optimizer = adamw(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.steps_done = 0

    def _autocast(self, device: torch.device) -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16) if self.bf16_autocast else nullcontext()

    def train_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One optimizer step on the masked mean NLL over every trained token of `trajectories`.

        Failed trajectories are skipped (they have no exact record).

        Returns:
            `loss` (mean NLL per trained token, nats), `tokens` (trained tokens), `grad_norm`, `train_seconds`.

        Raises:
            ConfigError: if no trajectory has a trained token.
        """
        t0 = time.perf_counter()
        device = next(self.model.parameters()).device
        usable = [t for t in trajectories if not t.failed and t.num_generated_tokens > 0]
        if not usable:
            raise ConfigError("no trajectory with trained tokens (all failed or empty)")
        batch = pack_trajectories(usable, pad_token_id=self.pad_token_id, device=device)
        total = float(batch.response_mask.sum())
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        nll_total = 0.0
        for rows in torch.split(torch.arange(batch.input_ids.shape[0], device=device), self.micro_batch_size):
            micro = batch.select(rows, trim=True)
            with self._autocast(device):
                logprobs = response_logprobs(self.model, micro)
            nll, _ = masked_nll(logprobs, micro.response_mask)
            (nll / total).backward()
            nll_total += float(nll.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return {
            "loss": nll_total / total,
            "tokens": total,
            "grad_norm": grad_norm,
            "train_seconds": time.perf_counter() - t0,
        }

    @torch.no_grad()
    def evaluate(self, trajectories: Sequence[Trajectory]) -> float:
        """Mean NLL per trained token (nats) of `trajectories` under the current model, without updating it."""
        device = next(self.model.parameters()).device
        batch = pack_trajectories(
            [t for t in trajectories if not t.failed], pad_token_id=self.pad_token_id, device=device
        )
        self.model.eval()
        nll_total, tokens = 0.0, 0.0
        for rows in torch.split(torch.arange(batch.input_ids.shape[0], device=device), self.micro_batch_size):
            micro = batch.select(rows, trim=True)
            with self._autocast(device):
                logprobs = response_logprobs(self.model, micro)
            nll, count = masked_nll(logprobs, micro.response_mask)
            nll_total, tokens = nll_total + float(nll), tokens + float(count)
        return nll_total / max(tokens, 1.0)
