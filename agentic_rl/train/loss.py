"""Token log-probabilities and the clipped policy-gradient loss of GRPO."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

import torch

from agentic_rl.errors import ConfigError, TrajectoryError
from agentic_rl.train.buckets import length_buckets
from agentic_rl.train.logprobs import SamplingDistribution, sampling_logprobs, token_logprobs
from agentic_rl.train.off_policy import (
    LOG_RATIO_MAX,
    ImportanceWeights,
    OffPolicyConfig,
    importance_weights,
    sequence_sums,
)
from agentic_rl.train.shared_prefix import MIN_SHARED_PREFIX, shared_prefix_length, suffix_inputs

__all__ = ["LOG_RATIO_MAX", "LossOutput", "grpo_loss", "response_logprobs", "token_logprobs"]


def response_logprobs(
    model: torch.nn.Module,
    batch,
    *,
    share_prefix: bool = True,  # noqa: ANN001
    bucket: bool = True,
    distribution: SamplingDistribution | None = None,
) -> torch.Tensor:
    """Log-probabilities the model gives each response token of a packed batch (`PackedBatch`).

    Only the columns that predict response tokens go through the output head when the model takes
    `logits_to_keep` (transformers' causal LMs do): the prompt columns' logits are never used, and the head
    (vocabulary x hidden) is a large share of a small model's compute (21% of SmolLM2-135M's forward per token).
    Two more savings, both giving the same values and gradients up to float summation order:

    - `share_prefix`: the tokens every row opens with (at least `MIN_SHARED_PREFIX`: the system prompt and tool
      schema, a GRPO group's question) run once and reach the rows through a key/value cache
      (`train.shared_prefix`).
    - `bucket`: rows of similar length run as separate forward passes, each padded only to its own rows
      (`train.buckets.length_buckets`), and their logprobs are put back in row order.

    With a `distribution` (the engine's temperature, top-k and top-p), each logprob is that of the tempered,
    truncated and renormalized distribution the engine sampled from (`sampling_logprobs`), what vLLM reports with
    `logprobs_mode="processed_logprobs"`; None or a plain one: the model's own softmax (`token_logprobs`).

    Returns:
        (B, R) float32; the logits predicting response token j come from column P - 1 + j. Columns past a row's
        last real response token hold 0 or the logprob of a pad token (masked by `response_mask` either way).
    """
    p = batch.prompt_width
    r = batch.responses.shape[1]
    if not _forward_takes(model, "logits_to_keep"):
        inputs = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "position_ids": batch.position_ids,
        }
        return sampling_logprobs(model(**inputs).logits[:, p - 1 : p - 1 + r], batch.responses, distribution)
    k = shared_prefix_length(batch.input_ids, batch.attention_mask, p) if share_prefix else 0
    cache = _prefix_cache(model, batch, k) if k >= MIN_SHARED_PREFIX else None
    k = k if cache is not None else 0
    groups = length_buckets(batch.attention_mask, p, skip=k) if bucket else []
    if len(groups) < 2:
        return _logprobs(model, batch, cache, k, distribution)
    parts = []
    for rows in groups:
        part = _logprobs(model, batch.select(rows, trim=True), cache, k, distribution)
        parts.append(torch.nn.functional.pad(part, (0, r - part.shape[1])))
    order = torch.cat(groups)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return torch.cat(parts)[inverse]


def _prefix_cache(model: torch.nn.Module, batch, k: int):  # noqa: ANN001, ANN202
    """The key/value cache of the first k real tokens of row 0 (batch 1), or None where the model has none that
    `_logprobs` can reuse (no `past_key_values`, or a cache other than plain full attention): rows then run whole."""
    if not _forward_takes(model, "past_key_values"):
        return None
    p = batch.prompt_width
    start = p - int(batch.attention_mask[0, :p].sum())
    prefix = batch.input_ids[:1, start : start + k]
    positions = torch.arange(k, device=prefix.device).unsqueeze(0)
    cache = getattr(
        model(input_ids=prefix, position_ids=positions, use_cache=True, logits_to_keep=1), "past_key_values", None
    )
    return cache if _plain_full_attention(cache) else None


def _plain_full_attention(cache: object) -> bool:
    """Whether every layer of a transformers cache keeps all past keys and values (`DynamicLayer` itself).

    Only such a cache can be cropped back to the prefix for the next group, and only full attention sees the
    prefix through the left padding `suffix_inputs` leaves between it and a row's own tokens: a sliding window
    counts those pad columns, and sliding-window and linear-attention layers refuse `crop`.
    """
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _logprobs(
    model: torch.nn.Module,
    batch,
    cache,
    k: int,  # noqa: ANN001
    distribution: SamplingDistribution | None = None,
) -> torch.Tensor:
    """(B, R) response logprobs (under `distribution`, `sampling_logprobs`) of one forward pass; rows read their
    first k tokens from `cache` when k > 0."""
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "position_ids": batch.position_ids}
    if k:
        grown = cache.get_seq_length() - k  # what an earlier group's pass appended to the prefix
        if grown:
            cache.crop(-grown)  # a negative count removes that many tokens, in every transformers version
        cache.batch_select_indices(
            torch.zeros(batch.input_ids.shape[0], dtype=torch.int64, device=batch.input_ids.device)
        )
        inputs = {
            **suffix_inputs(batch.input_ids, batch.attention_mask, batch.position_ids, batch.prompt_width, k),
            "past_key_values": cache,
            "use_cache": True,
        }
    # Exactly the R columns that predict response tokens (P - 1 ... P + R - 2 of the full row): naming them, rather
    # than keeping R + 1 and slicing the last off, spares the backward a zero-filled copy of the (B, R + 1, V) logits.
    r = batch.responses.shape[1]
    width = inputs["input_ids"].shape[1]
    keep = torch.arange(width - r - 1, width - 1, device=batch.input_ids.device)
    return sampling_logprobs(model(**inputs, logits_to_keep=keep).logits, batch.responses, distribution)


def _forward_takes(model: torch.nn.Module, argument: str) -> bool:
    """Whether `model.forward` names `argument` (transformers' causal LMs take `logits_to_keep`, `past_key_values`)."""
    try:
        return argument in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class LossOutput:
    """The loss and its diagnostics (all detached except `loss`; fractions are shares of this batch's response tokens).

    `loss`, `pg_loss` and `kl` are aggregated by `grpo_loss`'s `loss_agg_mode` and divided by its `normalizer` when
    one is given (then they are this batch's part of a larger mean); the other fields describe this batch alone.

    Attributes:
        loss: scalar to back-propagate.
        pg_loss: the policy-gradient part.
        kl: mean k3 KL estimate to the reference (0 without one).

        clip_fraction: share of response tokens whose policy gradient a clip cut off: the ratio clip (A > 0 and
            ratio > 1 + clip_high, or A < 0 and ratio < 1 - clip_low) or the dual clip (A < 0 and ratio >
            clip_ratio_c).
        dual_clip_fraction: share of response tokens cut off by the dual clip alone (counted in `clip_fraction` too).
        kl_clamp_fraction: share of response tokens whose KL log-ratio (ref - new) exceeded `LOG_RATIO_MAX` and was
            clamped (0 without a KL term).
        approx_kl_old: mean of (old_logprobs - new_logprobs) on response tokens, a drift diagnostic.
        is_weight_mean, is_weight_max: mean and max over response tokens of the importance weight
            w = pi_prox / pi_behav before truncation or masking (`off_policy.importance_weights`; with no proximal
            logprobs given, pi_prox is the policy itself: w = exp(new - old)); 0 for a batch without any.
        is_truncated_fraction: share of response tokens whose weight `tis` truncated.
        is_masked_fraction: share of response tokens `mask` gave weight 0.
    """

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    dual_clip_fraction: torch.Tensor
    kl_clamp_fraction: torch.Tensor
    approx_kl_old: torch.Tensor
    is_weight_mean: torch.Tensor
    is_weight_max: torch.Tensor
    is_truncated_fraction: torch.Tensor
    is_masked_fraction: torch.Tensor


def _aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    sequence_ids: torch.Tensor | None,
    normalizer: float | None = None,
) -> torch.Tensor:
    """Sum of (B, R) float32 `values` over the response tokens, divided by the count `mode` averages over.

    `token-mean` sums every response token (DAPO); `sequence-mean` sums each sequence's token mean (GRPO), a sequence
    being the rows of one `sequence_ids` (B,) value (default: one per row) and counting only if it has a response
    token. The divisor is `normalizer` when given (a count over more than this batch: every micro-batch and rank of
    a step), else this batch's own count of tokens or sequences (at least 1). Returns a scalar float32; raises
    `ConfigError` for another `mode`.
    """
    on = mask.bool()
    masked = torch.where(on, values, torch.zeros_like(values))
    if mode == "token-mean":
        return masked.sum() / (mask.sum().clamp(min=1) if normalizer is None else normalizer)
    if mode == "sequence-mean":
        _, sums, counts = sequence_sums(masked, mask, sequence_ids)
        present = counts > 0
        per_sequence = sums / counts.clamp(min=1)
        return (per_sequence * present).sum() / (present.sum().clamp(min=1) if normalizer is None else normalizer)
    raise ConfigError(f"loss_agg_mode must be 'token-mean' or 'sequence-mean', got {mode!r}")


def _check_settings(clip_ratio_c: float, normalizer: float | None) -> None:
    """Raise `ConfigError` unless `clip_ratio_c` > 1 and `normalizer` is None or > 0."""
    if not clip_ratio_c > 1.0:
        raise ConfigError(f"clip_ratio_c must be > 1 (Ye et al. 2020), got {clip_ratio_c}")
    if normalizer is not None and not normalizer > 0:
        raise ConfigError(f"normalizer must be > 0 (a count of response tokens or sequences), got {normalizer}")


def _check_finite(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    sequence_ids: torch.Tensor | None,
    proximal_logprobs: torch.Tensor | None = None,
) -> None:
    if old_logprobs.shape != new_logprobs.shape or response_mask.shape != new_logprobs.shape:
        raise TrajectoryError(
            f"new_logprobs {tuple(new_logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} "
            f"and response_mask {tuple(response_mask.shape)} must have one (B, R) shape"
        )
    if advantages.shape not in (new_logprobs.shape, new_logprobs.shape[:1]):
        raise TrajectoryError(f"advantages must be (B,) or (B, R), got {tuple(advantages.shape)}")
    for name, tensor in (("ref_logprobs", ref_logprobs), ("proximal_logprobs", proximal_logprobs)):
        if tensor is not None and tensor.shape != new_logprobs.shape:
            raise TrajectoryError(f"{name} must be (B, R) like new_logprobs, got {tuple(tensor.shape)}")
    if sequence_ids is not None and sequence_ids.shape != new_logprobs.shape[:1]:
        raise TrajectoryError(f"sequence_ids must be (B,), got {tuple(sequence_ids.shape)}")
    tensors = {
        "old_logprobs": old_logprobs,
        "advantages": advantages,
        "ref_logprobs": ref_logprobs,
        "proximal_logprobs": proximal_logprobs,
    }
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
    clip_ratio_c: float = 3.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    loss_agg_mode: Literal["token-mean", "sequence-mean"] = "token-mean",
    sequence_ids: torch.Tensor | None = None,
    normalizer: float | None = None,
    off_policy: OffPolicyConfig | None = None,
    proximal_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """Dual-clipped importance-ratio policy loss, decoupled from the behaviour policy or not, with a k3 KL penalty.

    Per response token, with the trajectory's advantage A on each of its tokens (GRPO, Shao et al. 2024,
    "DeepSeekMath"), and r = exp(min(new - old, LOG_RATIO_MAX)) (`_policy_ratio`):

    - clipped objective: J = min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) (PPO, Schulman et al. 2017,
      "Proximal Policy Optimization Algorithms", eq. 7; `_clipped_surrogate`);
    - dual clip: for A < 0, J = max(J, clip_ratio_c * A) (Ye et al. 2020, "Mastering Complex Control in MOBA Games
      with Deep Reinforcement Learning"; `_dual_clip`); pg = -J.
    - decoupled PPO (`off_policy` `tis` or `mask`; Hilton et al. 2021, see `train.off_policy`): r = exp(min(new -
      prox, LOG_RATIO_MAX)), pg = -w' * J, w' the truncated or masked constant weight pi_prox / pi_behav (= old).

    KL to the reference uses the k3 estimator exp(d) - d - 1 with d = min(ref - new, LOG_RATIO_MAX) (Schulman 2020,
    "Approximating KL Divergence"; `_k3_kl`). `token-mean` averages over all response tokens of the batch (DAPO, Yu
    et al. 2025); `sequence-mean` over each sequence's tokens, then over sequences (GRPO; `_aggregate`); a masked
    token counts in both with weight 0. loss = pg + kl_coef * KL. With `normalizer` N, both are sums divided by N: a
    batch that is one part of a step then adds exactly its part of the step's mean. Log-ratios are bounded above by
    LOG_RATIO_MAX = 20 nats before `exp` (`_policy_ratio`, `_k3_kl`); all is float32 whatever the input dtype.

    Args:
        new_logprobs: (B, R) float, log-probabilities (nats) under the policy being trained (with gradient).
        old_logprobs: (B, R) float, the engine's logprobs at sampling time (nats): the behaviour policy.
        advantages: (B,) or (B, R) float.
        response_mask: (B, R) float or bool, 1 on the tokens that enter the loss (sampled tokens of valid rows).
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].
        clip_ratio_c: dual-clip bound (> 1) on the ratio of negative-advantage tokens.
        ref_logprobs: (B, R) reference-policy logprobs (nats), or None; with `kl_coef` 0 the KL is still measured
            (the output's `kl`), not in the loss.
        kl_coef: weight of the KL term.
        loss_agg_mode: `token-mean` or `sequence-mean`.
        sequence_ids: (B,) int, rows with one id are parts of one sequence for `sequence-mean` and `sequence`-level
            masking (the runs of a trajectory whose history memory rewrote); default: every row is its own sequence.
        normalizer: the divisor of `pg_loss` and `kl` (> 0); None: this batch's count of response tokens
            (`token-mean`) or of sequences with one (`sequence-mean`).
        off_policy: the correction; None or `none`: plain PPO on new / old (no decoupling).
        proximal_logprobs: (B, R) float, log pi_prox (nats); None: new_logprobs detached (the policy before the
            step, when a batch takes one optimizer step). Under `none` only the IS diagnostics read it.

    Returns:
        A `LossOutput`; rows without response tokens contribute nothing, and an all-masked batch gives loss 0.

    Raises:
        ConfigError: for an unknown `loss_agg_mode`, `clip_ratio_c` <= 1, or `normalizer` <= 0.
        TrajectoryError: naming the tensor, if `old_logprobs`, `advantages`, `ref_logprobs` or `proximal_logprobs`
            holds NaN or Inf anywhere, or `new_logprobs` does on a response token; or if shapes disagree.
    """
    _check_settings(clip_ratio_c, normalizer)
    _check_finite(new_logprobs, old_logprobs, advantages, response_mask, ref_logprobs, sequence_ids, proximal_logprobs)
    new = new_logprobs.float()
    mask = response_mask.float()
    adv = advantages.float() if advantages.dim() == 2 else advantages.float()[:, None].expand_as(new)
    log_ratio, log_ratio_prox, weights = _log_ratios(
        new, old_logprobs, mask, proximal_logprobs, off_policy, sequence_ids
    )
    objective, ratio_clipped, dual = _objective(log_ratio_prox, adv, weights, clip_low, clip_high, clip_ratio_c)
    pg_loss = _aggregate(-objective, mask, loss_agg_mode, sequence_ids, normalizer)
    kl, kl_clamped = _k3_kl(new, ref_logprobs, mask, loss_agg_mode, sequence_ids, normalizer)
    loss, clipped = pg_loss + kl_coef * kl, ratio_clipped | dual
    return _loss_output(
        loss, pg_loss, kl, log_ratio, mask, clipped=clipped, dual=dual, kl_clamped=kl_clamped, weights=weights
    )


_NO_CORRECTION = OffPolicyConfig(correction="none")


def _log_ratios(
    new: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    proximal_logprobs: torch.Tensor | None,
    off_policy: OffPolicyConfig | None,
    sequence_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, ImportanceWeights]:
    """Which policy the ratio is taken against: the behaviour policy (plain PPO), or the proximal one with the
    behaviour policy's importance weights (decoupled PPO).

    Args:
        new: (B, R) float32 policy logprobs (nats, with gradient).
        old_logprobs, proximal_logprobs, off_policy, sequence_ids: as `grpo_loss` takes them.
        mask: (B, R) float32 response mask.

    Returns:
        new - old, (B, R) float32, 0 off the response; the log-ratio the objective clips (new - proximal when the
        correction decouples, else new - old); the importance weights (`off_policy.importance_weights`).
    """
    on_response = mask.bool()  # `where`, not `* mask`: a NaN on a padding position must not reach the loss
    log_ratio = torch.where(on_response, new - old_logprobs.float(), 0.0)
    proximal = new.detach() if proximal_logprobs is None else proximal_logprobs.float()
    weights = importance_weights(proximal, old_logprobs, mask, off_policy or _NO_CORRECTION, sequence_ids)
    log_ratio_prox = torch.where(on_response, new - proximal, 0.0) if weights.decoupled else log_ratio
    return log_ratio, log_ratio_prox, weights


def _objective(
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    weights: ImportanceWeights,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dual-clipped objective J of each token, times its importance weight when `weights.decoupled`.

    Args:
        log_ratio: (B, R) float32, new - old (plain PPO) or new - proximal (decoupled) logprob, 0 off the response.
        adv: (B, R) float32 advantage of each token.
        weights: the importance weights (`off_policy.importance_weights`).
        clip_low, clip_high, clip_ratio_c: as `grpo_loss` takes them.

    Returns:
        J, (B, R) float32; (B, R) bool where the ratio clip won; (B, R) bool where the dual clip replaced J.
    """
    objective, ratio_clipped = _clipped_surrogate(_policy_ratio(log_ratio), adv, clip_low, clip_high)
    objective, dual = _dual_clip(objective, adv, clip_ratio_c)
    if weights.decoupled:
        objective = weights.weight * objective
    return objective, ratio_clipped, dual


def _policy_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """The importance ratio new / old = exp(min(new - old, LOG_RATIO_MAX)).

    float32 `exp` overflows past ~88.7, and e^20 ~ 4.9e8 stays finite in float32 and bfloat16 even times a large
    advantage and summed over millions of tokens. The bound costs no gradient: a token past it is already clipped
    (ratio > 1 + clip_high for A > 0, ratio > clip_ratio_c for A < 0; any setting below e^20), so its gradient is 0
    either way. There is no lower bound: exp of a very negative log-ratio underflows to 0 harmlessly.

    Args:
        log_ratio: (B, R) float32, new - old logprob (nats), 0 off the response.

    Returns:
        (B, R) float32 ratio, in (0, e^20].
    """
    return torch.exp(torch.clamp(log_ratio, max=LOG_RATIO_MAX))


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped objective J = min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) (Schulman et al.
    2017, eq. 7).

    Args:
        ratio: (B, R) float32 importance ratio.
        adv: (B, R) float32 advantage of each token.
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].

    Returns:
        J, (B, R) float32; and (B, R) bool, where the clip branch won (no gradient through the ratio there).
    """
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def _dual_clip(objective: torch.Tensor, adv: torch.Tensor, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For A < 0, J = max(J, clip_ratio_c * A) (Ye et al. 2020, dual clip).

    Without it, J = ratio * A is unbounded below for A < 0: a token whose ratio is e^8 would pull with a gradient of
    ~3000 |A|. With it, a negative-advantage token contributes at most clip_ratio_c * |A| and no gradient once
    ratio > clip_ratio_c.

    Args:
        objective: (B, R) float32 clipped objective J.
        adv: (B, R) float32 advantage of each token.
        clip_ratio_c: the bound (> 1) on the ratio of negative-advantage tokens.

    Returns:
        The dual-clipped J, (B, R) float32; and (B, R) bool, where the dual clip replaced J.
    """
    floor = clip_ratio_c * adv
    dual = (adv < 0) & (floor > objective)
    return torch.where(dual, floor, objective), dual


def _k3_kl(
    new: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    mode: str,
    sequence_ids: torch.Tensor | None,
    normalizer: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k3 KL estimate exp(d) - d - 1, d = min(ref - new, LOG_RATIO_MAX) (Schulman 2020), aggregated like the loss.

    Unclamped, a token with new logprob -95 and reference -1 would give exp(94) = inf and an infinite loss. Past the
    bound the true gradient, 1 - e^d, is below -4.9e8 and would swamp every other token, so the clamp stops it
    instead (0 gradient, counted in `kl_clamp_fraction`). Below it nothing is bounded: exp(d) underflows to 0
    harmlessly and the k3 term -d stays exact.

    Args:
        new: (B, R) float32 policy logprobs (nats, with gradient).
        ref_logprobs: (B, R) float reference-policy logprobs (nats); None: no KL term (0, nothing clamped).
        mask: (B, R) float32 response mask.
        mode, sequence_ids, normalizer: as `_aggregate` takes them.

    Returns:
        The scalar float32 KL; and (B, R) bool, where d was clamped.
    """
    if ref_logprobs is None:
        return torch.zeros((), device=new.device), torch.zeros_like(mask.bool())
    delta = torch.where(mask.bool(), ref_logprobs.float() - new, 0.0)
    clamped = delta > LOG_RATIO_MAX
    delta = torch.clamp(delta, max=LOG_RATIO_MAX)
    return _aggregate(torch.exp(delta) - delta - 1.0, mask, mode, sequence_ids, normalizer), clamped


def _loss_output(
    loss: torch.Tensor,
    pg_loss: torch.Tensor,
    kl: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    *,
    clipped: torch.Tensor,
    dual: torch.Tensor,
    kl_clamped: torch.Tensor,
    weights: ImportanceWeights,
) -> LossOutput:
    """The loss with its detached diagnostics, each flag counted as a share of the response tokens.

    Args:
        loss, pg_loss, kl: scalar float32 (only `loss` keeps its gradient).
        log_ratio: (B, R) float32 new - old logprob (nats), 0 off the response.
        mask: (B, R) float32 response mask.
        clipped, dual, kl_clamped: (B, R) bool, tokens any clip cut off, the dual clip alone, a clamped KL log-ratio.
        weights: the importance weights (their raw values, truncated and masked tokens are reported).

    Returns:
        The `LossOutput`.
    """
    on_response = mask.bool()
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)

        def share(flags: torch.Tensor) -> torch.Tensor:
            return (flags & on_response).sum() / tokens

        raw = weights.raw[on_response]
        return LossOutput(
            loss=loss,
            pg_loss=pg_loss.detach(),
            kl=kl.detach(),
            clip_fraction=share(clipped),
            dual_clip_fraction=share(dual),
            kl_clamp_fraction=share(kl_clamped),
            approx_kl_old=(-log_ratio * mask).sum() / tokens,
            is_weight_mean=raw.sum() / tokens,
            is_weight_max=raw.max() if raw.numel() else raw.new_zeros(()),
            is_truncated_fraction=share(weights.truncated),
            is_masked_fraction=share(weights.masked),
        )
