"""Off-policy correction of the policy loss: decoupled PPO's importance weight, truncated or masked, and lag metrics.

A token trained in a step was sampled by the engine (the behaviour policy pi_behav, its logprob recorded as
`old_logprobs`), possibly with weights some versions older than the trainer's, and always in another precision.
Decoupled PPO (Hilton, Cobbe & Schulman 2021, "Batch size-invariance for policy optimization", eq. 3; used for
asynchronous RL by AReaL, Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning") separates the policy the clip keeps the update close to, the proximal policy pi_prox, from the
one that sampled the data:

    J = w * min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A),   r = pi_theta / pi_prox,   w = pi_prox / pi_behav

with w a constant (no gradient). The trainer takes one optimizer step per batch, so pi_prox is the policy before that
step: the trainer's own logprobs, detached, from the same forward pass (r = 1 in value, its gradient that of
log pi_theta). `OffPolicyConfig.correction` bounds w's variance:

- `tis`: truncated importance sampling, w' = min(w, tis_cap) (Espeholt et al. 2018, "IMPALA", the truncated
  weight of V-trace; for an engine-trainer mismatch: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
  You Off-Policy RL Training").
- `mask`: masked importance sampling (Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from
  the Training-Inference Mismatch"): w' = w where w lies in [mask_low, mask_high], 0 elsewhere (`token` level); at
  `sequence` level every token of a sequence gets 0 when the sequence's geometric-mean weight
  exp(mean over its response tokens of log w) lies outside the bounds. Liu et al. bound the product of the token
  weights; the geometric mean is its length-normalized form, so one pair of bounds fits sequences of every length.
- `none`: no decoupling: the clipped ratio pi_theta / pi_behav of plain PPO/GRPO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentic_rl.train.grpo_config import OffPolicyConfig

__all__ = ["LOG_RATIO_MAX", "ImportanceWeights", "OffPolicyConfig", "importance_weights", "lag_sums", "sequence_sums"]

LOG_RATIO_MAX = 20.0
"""Upper bound (nats) on a log-ratio before `exp`: in the policy ratio and the k3 KL (see `loss.grpo_loss`) and in the
importance weight (`importance_weights`)."""


@dataclass(frozen=True, slots=True)
class ImportanceWeights:
    """The per-token importance weights of a (B, R) batch, all detached.

    Attributes:
        weight: (B, R) float32 w' that multiplies each token's clipped objective (1 off the response).
        raw: (B, R) float32 w = exp(min(log pi_prox - log pi_behav, 20)) before truncation or masking (1 off the
            response).
        truncated: (B, R) bool, response tokens `tis` truncated (w > tis_cap).
        masked: (B, R) bool, response tokens `mask` set to 0.
        decoupled: whether the correction decouples the proximal policy from the behaviour one (`tis`, `mask`);
            False under `none`, where the loss keeps the plain ratio pi_theta / pi_behav.
    """

    weight: torch.Tensor
    raw: torch.Tensor
    truncated: torch.Tensor
    masked: torch.Tensor
    decoupled: bool = True


def importance_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    config: OffPolicyConfig,
    sequence_ids: torch.Tensor | None = None,
) -> ImportanceWeights:
    """w = pi_prox / pi_behav per response token and the weight `config.correction` makes of it (see the module).

    Args:
        proximal_logprobs: (B, R) float, log pi_prox (nats); detached here.
        behaviour_logprobs: (B, R) float, log pi_behav, the engine's logprobs (nats).
        response_mask: (B, R) float or bool, 1 on the tokens that enter the loss.
        config: the correction; under `none` the weight is 1 everywhere (nothing truncated or masked).
        sequence_ids: (B,) int, rows with one id form one sequence for `sequence`-level masking (the runs of a
            trajectory whose history was rewritten); default: every row is its own sequence.

    Returns:
        The `ImportanceWeights`. log w is bounded above by 20 nats before `exp` (float32 overflow); a sequence's
        geometric mean uses the unbounded log w.
    """
    on = response_mask.bool()
    log_w = torch.where(on, proximal_logprobs.detach().float() - behaviour_logprobs.float(), 0.0)
    raw = torch.exp(torch.clamp(log_w, max=LOG_RATIO_MAX))
    none = torch.zeros_like(on)
    if config.correction == "tis":
        truncated = on & (raw > config.tis_cap)
        return ImportanceWeights(torch.clamp(raw, max=config.tis_cap), raw, truncated, none)
    if config.correction == "mask":
        low, high = math.log(config.mask_low), math.log(config.mask_high)
        if config.mask_level == "token":
            outside = (log_w < low) | (log_w > high)
        else:
            mean = _sequence_mean(log_w, on, sequence_ids)
            outside = ((mean < low) | (mean > high))[:, None].expand_as(on)
        masked = on & outside
        return ImportanceWeights(torch.where(masked, 0.0, raw), raw, none, masked)
    return ImportanceWeights(torch.ones_like(raw), raw, none, none, decoupled=False)


def _sequence_mean(values: torch.Tensor, on: torch.Tensor, sequence_ids: torch.Tensor | None) -> torch.Tensor:
    """(B,) float32: for each row, the mean of `values` over the response tokens (`on`) of its sequence (0 when
    the sequence has none)."""
    seq, sums, counts = sequence_sums(torch.where(on, values, 0.0), on.float(), sequence_ids)
    return (sums / counts.clamp(min=1))[seq]


def sequence_sums(
    masked_values: torch.Tensor, mask: torch.Tensor, sequence_ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sequence, the sum of (B, R) `masked_values` (already 0 off the mask) and the count of `mask`'s tokens.

    Args:
        masked_values: (B, R) float.
        mask: (B, R) float, 1 on the tokens counted.
        sequence_ids: (B,) int, rows with one id form one sequence; None: every row is its own.

    Returns:
        (B,) int64 index of each row's sequence (0 ... S - 1), and (S,) sums and (S,) counts in `masked_values`'
        dtype.
    """
    if sequence_ids is None:
        sequence_ids = torch.arange(masked_values.shape[0], device=masked_values.device)
    _, seq = torch.unique(sequence_ids, return_inverse=True)
    n = int(seq.max()) + 1 if seq.numel() else 0
    zeros = torch.zeros(n, dtype=masked_values.dtype, device=masked_values.device)
    sums = zeros.index_add(0, seq, masked_values.sum(-1))
    counts = zeros.index_add(0, seq, mask.to(masked_values.dtype).sum(-1))
    return seq, sums, counts


def lag_sums(
    values: torch.Tensor, weight_versions: torch.Tensor, mask: torch.Tensor, weight_version: int | None
) -> dict[int, tuple[float, int]]:
    """Sum and count of `values` by lag = `weight_version` - the token's version, over the tokens of `mask` whose
    version is known (>= 0).

    Args:
        values: (B, R) float, e.g. |trainer - engine| logprob (nats), or ones to count tokens.
        weight_versions: (B, R) int64, the weight version that sampled each token, -1 where inserted or unknown
            (`PackedBatch.weight_versions`).
        mask: (B, R) float or bool, the tokens to count (e.g. the response mask).
        weight_version: the trainer's version (the weights the step updates); None: not known.

    Returns:
        `{lag: (sum, count)}` in increasing lag; empty when `weight_version` is None or no token's version is known.
        A negative lag (a token sampled by a version newer than `weight_version`) is reported as it is.
    """
    if weight_version is None:
        return {}
    known = mask.bool() & (weight_versions >= 0)
    lags = weight_version - weight_versions[known]
    if not lags.numel():
        return {}
    keys, index, counts = torch.unique(lags, return_inverse=True, return_counts=True)
    sums = torch.zeros(keys.numel(), dtype=torch.float64, device=values.device)
    sums = sums.index_add(0, index, values[known].double())
    return {int(k): (float(s), int(c)) for k, s, c in zip(keys.tolist(), sums.tolist(), counts.tolist(), strict=True)}
