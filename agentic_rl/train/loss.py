"""Token log-probabilities and the clipped policy-gradient loss of GRPO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from agentic_rl.errors import ConfigError, TrajectoryError

__all__ = ["LossOutput", "grpo_loss", "response_logprobs", "token_logprobs"]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position, computed row by row to bound memory.

    Args:
        logits: (B, T, V) float.
        targets: (B, T) int64.

    Returns:
        (B, T) float32 log-probabilities in nats.
    """
    out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
    for i in range(logits.shape[0]):  # a (T, V) float32 copy at a time instead of (B, T, V)
        row = logits[i].float()
        out[i] = row.gather(-1, targets[i].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(row, dim=-1)
    return out


def response_logprobs(model: torch.nn.Module, batch) -> torch.Tensor:  # noqa: ANN001  (PackedBatch)
    """Log-probabilities the model gives each response token of a packed batch.

    Returns:
        (B, R) float32; the logits predicting response token j come from column P - 1 + j.
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    p = batch.prompt_width
    r = batch.responses.shape[1]
    logits = out.logits[:, p - 1 : p - 1 + r]
    return token_logprobs(logits, batch.responses)


@dataclass(frozen=True, slots=True)
class LossOutput:
    """The loss and its diagnostics (all detached except `loss`).

    Attributes:
        loss: scalar to back-propagate.
        pg_loss: the policy-gradient part.
        kl: mean k3 KL estimate to the reference (0 without one).
        clip_fraction: share of response tokens whose ratio was clipped.
        approx_kl_old: mean of (old_logprobs - new_logprobs) on response tokens, a drift diagnostic.
    """

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl_old: torch.Tensor


def _aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if mode == "sequence-mean":
        per_row = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        rows = (mask.sum(-1) > 0).float()
        return (per_row * rows).sum() / rows.sum().clamp(min=1)
    raise ConfigError(f"loss_agg_mode must be 'token-mean' or 'sequence-mean', got {mode!r}")


def _check_finite(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
) -> None:
    if old_logprobs.shape != new_logprobs.shape or response_mask.shape != new_logprobs.shape:
        raise TrajectoryError(f"new_logprobs {tuple(new_logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} "
                              f"and response_mask {tuple(response_mask.shape)} must have one (B, R) shape")  # fmt: skip
    if advantages.shape not in (new_logprobs.shape, new_logprobs.shape[:1]):
        raise TrajectoryError(f"advantages must be (B,) or (B, R), got {tuple(advantages.shape)}")
    tensors = {"old_logprobs": old_logprobs, "advantages": advantages, "ref_logprobs": ref_logprobs}
    for name, tensor in tensors.items():
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            raise TrajectoryError(f"{name} holds {int((~torch.isfinite(tensor)).sum())} NaN or Inf value(s)")
    on_response = response_mask.bool()
    if not bool(torch.isfinite(new_logprobs.detach()[on_response]).all()):
        raise TrajectoryError("new_logprobs holds NaN or Inf on response tokens (has the policy diverged?)")


def grpo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    loss_agg_mode: Literal["token-mean", "sequence-mean"] = "token-mean",
) -> LossOutput:
    """Clipped importance-ratio policy loss with an optional KL penalty.

    Per token: ratio = exp(new - old); pg = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
    (PPO, Schulman et al. 2017, eq. 7), with the trajectory's advantage A on each of its tokens (GRPO, Shao et al.
    2024). KL to the reference uses the k3 estimator exp(ref - new) - (ref - new) - 1 (Schulman 2020, "Approximating
    KL divergence"). `token-mean` averages over all response tokens of the batch (DAPO, Yu et al. 2025);
    `sequence-mean` averages per sequence first (the original GRPO).

    Args:
        new_logprobs: (B, R) float, log-probabilities under the policy being trained (with gradient).
        old_logprobs: (B, R) float, the engine's logprobs at sampling time.
        advantages: (B,) or (B, R) float.
        response_mask: (B, R) float, 1 on sampled tokens of valid rows.
        clip_low, clip_high: ratio clip range.
        ref_logprobs: (B, R) reference-policy logprobs, or None.
        kl_coef: weight of the KL term.
        loss_agg_mode: `token-mean` or `sequence-mean`.

    Raises:
        ConfigError: for an unknown `loss_agg_mode`.
        TrajectoryError: naming the tensor, if `old_logprobs`, `advantages` or `ref_logprobs` holds NaN or Inf
            anywhere, or `new_logprobs` does on a response token (a diverged policy); or if shapes disagree.
    """
    _check_finite(new_logprobs, old_logprobs, advantages, response_mask, ref_logprobs)
    mask = response_mask.to(new_logprobs.dtype)
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(new_logprobs)
    on_response = mask.bool()  # `where`, not `* mask`: a NaN on a padding position must not reach the loss
    log_ratio = torch.where(on_response, new_logprobs - old_logprobs, 0.0)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    pg_loss = _aggregate(pg, mask, loss_agg_mode)
    kl = torch.zeros((), device=new_logprobs.device)
    if ref_logprobs is not None and kl_coef:
        delta = torch.where(on_response, ref_logprobs - new_logprobs, 0.0)
        kl = _aggregate(torch.exp(delta) - delta - 1.0, mask, loss_agg_mode)
    loss = pg_loss + kl_coef * kl
    with torch.no_grad():
        clip_fraction = ((clipped < unclipped).float() * mask).sum() / mask.sum().clamp(min=1)  # clip active
        approx_kl_old = (-log_ratio * mask).sum() / mask.sum().clamp(min=1)
    return LossOutput(loss=loss, pg_loss=pg_loss.detach(), kl=kl.detach(), clip_fraction=clip_fraction,
                      approx_kl_old=approx_kl_old)  # fmt: skip
