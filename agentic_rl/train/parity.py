"""Logprob parity between the training model and the engine that sampled a batch."""

from __future__ import annotations

from typing import Any

import torch

from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.packing import PackedBatch

__all__ = ["logprob_parity"]


@torch.no_grad()
def logprob_parity(model: torch.nn.Module, batch: PackedBatch) -> dict[str, Any]:
    """Compare the model's logprobs of the sampled tokens with the engine's (`batch.old_logprobs`).

    With the same weights and dtype the two should agree closely (fp32 on both sides: ~1e-5 nats); a large gap
    means the packing, the masks or the weight sync is wrong. The engine must record raw logprobs (vLLM's default
    `raw_logprobs`), i.e. at temperature 1.

    Returns:
        `{"mean_abs_diff", "max_abs_diff"}` in nats over tokens with `response_mask` 1, and `"tokens"`, their count.
    """
    mask = batch.response_mask.bool()
    new = response_logprobs(model, batch)
    diff = (new - batch.old_logprobs).abs()[mask]
    if diff.numel() == 0:
        return {"mean_abs_diff": 0.0, "max_abs_diff": 0.0, "tokens": 0}
    return {"mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()), "tokens": int(diff.numel())}
