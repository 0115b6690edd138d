"""Token log-probabilities of a model's logits: under the plain softmax (`token_logprobs`), or under the distribution
an engine sampled from, tempered and truncated to the top-k and top-p tokens (`SamplingDistribution`,
`sampling_logprobs`)."""

from __future__ import annotations

import torch

from agentic_rl.train.sampling_distribution import SamplingDistribution

__all__ = ["SamplingDistribution", "sampling_logprobs", "token_logprobs"]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position, computed row by row to bound memory.

    Args:
        logits: (B, T, V) float.
        targets: (B, T) int64.

    Returns:
        (B, T) float32 log-probabilities in nats.
    """
    # A (T, V) float32 copy at a time instead of (B, T, V). Rows come from `unbind`, whose backward stacks the B row
    # gradients once; indexing `logits[i]` instead made every row's backward a zero-filled (B, T, V) tensor, summed
    # B times (12% of a SmolLM2-135M SFT step on the CPU).
    rows = [
        row.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(row, dim=-1)
        for row, target in zip((r.float() for r in logits.unbind(0)), targets.unbind(0), strict=True)
    ]
    return torch.stack(rows) if rows else torch.empty(targets.shape, dtype=torch.float32, device=logits.device)


def sampling_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, distribution: SamplingDistribution | None = None
) -> torch.Tensor:
    """log P(target) per position under `distribution` of `logits`, computed row by row to bound memory.

    P = softmax(logits / temperature) restricted to the tokens the top-k and then the top-p filter keep, and
    renormalized over them (`SamplingDistribution` gives the exact conventions, vLLM's). This is the logprob that
    vLLM reports for a sampled token with `logprobs_mode="processed_logprobs"` and no penalty, bias or min-p.

    A target outside the kept set has probability 0 there; its value is instead its logprob under the tempered,
    untruncated softmax, log softmax(logits / temperature)[target]: finite, below the truncated logprob of every
    kept token, and with the tempered softmax's gradient. For a token the engine sampled this happens only when the
    weights moved since (a later update of the same batch) or by float noise at the nucleus boundary; the value then
    drops by log Z, Z the kept tokens' tempered mass (at most -log(top_p) nats without top-k), instead of to -inf,
    which would make the loss (its importance ratio, a reference's KL) infinite.

    Without a distribution, or a plain one, this is `token_logprobs` itself (the same values, bit for bit, and
    cost). Otherwise each (T, V) row is sorted once (only with top-p; top-k alone takes a `topk`), in float32.

    Args:
        logits: (B, T, V) or (T, V) float.
        targets: (B, T) or (T,) int64 token ids in [0, V).
        distribution: the sampling distribution; None = the plain softmax.

    Returns:
        (B, T) or (T,) float32 log-probabilities in nats, differentiable with respect to `logits` (a target's own
        logit and those of the kept tokens).

    Raises:
        ValueError: if `logits` is not 2-D or 3-D or `targets` is not its shape without the last dimension.
    """
    if logits.dim() not in (2, 3) or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"logits must be (B, T, V) or (T, V) and targets their shape without V, got "
            f"{tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if logits.dim() == 2:
        return sampling_logprobs(logits.unsqueeze(0), targets.unsqueeze(0), distribution).squeeze(0)
    if distribution is None or distribution.is_plain:
        return token_logprobs(logits, targets)
    rows = [
        _row_logprobs(row.float(), target, distribution)
        for row, target in zip(logits.unbind(0), targets.unbind(0), strict=True)
    ]
    return torch.stack(rows) if rows else torch.empty(targets.shape, dtype=torch.float32, device=logits.device)


def _row_logprobs(row: torch.Tensor, target: torch.Tensor, distribution: SamplingDistribution) -> torch.Tensor:
    """(T,) truncated logprobs of one (T, V) float32 row (`sampling_logprobs`)."""
    scaled = row / distribution.temperature if distribution.temperature != 1.0 else row
    picked = scaled.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    tempered = picked - torch.logsumexp(scaled, dim=-1)
    with torch.no_grad():
        kept = _kept(scaled.detach(), distribution)
    if kept is None:
        return tempered
    inside = kept.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    truncated = picked - torch.logsumexp(scaled.masked_fill(~kept, float("-inf")), dim=-1)
    return torch.where(inside, truncated, tempered)


def _kept(scaled: torch.Tensor, distribution: SamplingDistribution) -> torch.Tensor | None:
    """(T, V) bool, the tokens the top-k and top-p filters keep of tempered logits `scaled`; None when they keep all.

    The same operations, in float32 and in the same order, as vLLM 0.32's PyTorch path (the one its CPU backend
    takes): `apply_top_k_only` (top-k alone: compare with the k-th largest value) and `apply_top_k_top_p_pytorch`
    (sort ascending, drop below the k-th largest,
    softmax, cumulative sum, drop while <= 1 - top_p, keep the last). Tokens tied exactly at the top-p boundary are
    ordered by id (a stable sort: the lower ids are dropped first); vLLM's sort is not stable, so which of them it
    keeps is unspecified.
    """
    v = scaled.shape[-1]
    k = distribution.top_k if 0 < distribution.top_k < v else 0
    if distribution.top_p == 1.0:
        if not k:
            return None
        return scaled >= scaled.topk(k, dim=-1).values[:, -1:]
    ordered, order = scaled.sort(dim=-1, stable=True)
    if k:
        ordered = ordered.masked_fill(ordered < ordered[:, v - k : v - k + 1], float("-inf"))
    cumulative = ordered.softmax(dim=-1).cumsum_(dim=-1)
    drop = cumulative <= 1 - torch.tensor(distribution.top_p, dtype=torch.float32, device=scaled.device)
    drop[:, -1] = False
    return torch.empty_like(drop).scatter_(-1, order, ~drop)
