"""Logprobs under the tempered, top-k / top-p truncated distribution, against a direct reference computation."""

from __future__ import annotations

import math

import pytest
import torch

from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.vllm_config import VLLMEngineConfig
from agentic_rl.engine.vllm_config import llm_kwargs as _llm_kwargs
from agentic_rl.errors import ConfigError
from agentic_rl.train.logprobs import SamplingDistribution, sampling_logprobs, token_logprobs

DISTRIBUTIONS = [
    SamplingDistribution(temperature=0.7),
    SamplingDistribution(top_k=5),
    SamplingDistribution(top_p=0.8),
    SamplingDistribution(temperature=0.7, top_k=5, top_p=0.8),
    SamplingDistribution(temperature=1.3, top_p=0.5),
    SamplingDistribution(temperature=0.5, top_k=1),
    SamplingDistribution(top_k=3, top_p=0.95),
]


def _reference_kept(x: torch.Tensor, d: SamplingDistribution) -> set[int]:
    """The kept token ids of one float64 vector of tempered logits, token by token: top-k keeps every value >= the
    k-th largest; top-p walks up from the least likely kept token (ties: lower id first) and keeps a token once the
    mass walked so far, its own included, exceeds 1 - top_p, and always the last one."""
    values = x.tolist()
    kept = set(range(len(values)))
    if 0 < d.top_k < len(values):
        kth = sorted(values, reverse=True)[d.top_k - 1]
        kept = {i for i in kept if values[i] >= kth}
    if d.top_p < 1.0:
        ascending = sorted(kept, key=lambda i: (values[i], i))
        total = sum(math.exp(values[i]) for i in ascending)
        walked, nucleus = 0.0, set()
        for n, i in enumerate(ascending):
            walked += math.exp(values[i]) / total
            if walked > 1.0 - d.top_p or n == len(ascending) - 1:
                nucleus.add(i)
        kept = nucleus
    return kept


def _reference(logits: torch.Tensor, targets: torch.Tensor, d: SamplingDistribution) -> torch.Tensor:
    """Position by position in float64: log of the renormalized probability over the kept set, or the tempered
    softmax's logprob for a target outside it."""
    flat = logits.reshape(-1, logits.shape[-1]).double() / d.temperature
    out = []
    for x, target in zip(flat, targets.reshape(-1).tolist(), strict=True):
        kept = sorted(_reference_kept(x, d))
        support = kept if target in kept else list(range(x.numel()))
        out.append(x[target] - torch.logsumexp(x[support], dim=0))
    return torch.stack(out).reshape(targets.shape).float()


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=repr)
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_matches_the_reference_computation(distribution, ties):
    g = torch.Generator().manual_seed(0)
    shape = (3, 6, 40)
    logits = torch.randint(-3, 3, shape, generator=g).float() if ties else torch.randn(shape, generator=g) * 3
    # every token of the vocabulary as a target, kept or not, at every position
    targets = torch.arange(40).repeat(3, 6, 1)
    wide = logits.unsqueeze(2).expand(3, 6, 40, 40).reshape(3, 240, 40)
    got = sampling_logprobs(wide, targets.reshape(3, 240), distribution)
    assert torch.allclose(got, _reference(wide, targets.reshape(3, 240), distribution), atol=1e-5)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=repr)
def test_the_kept_tokens_probabilities_sum_to_one_and_the_others_are_finite(distribution):
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(1)) * 4
    every = torch.arange(64).repeat(5, 1)  # (T=5 positions, each target id)
    wide = logits.repeat_interleave(64, dim=0)  # (5 * 64, V): row i*64 + v asks position i for token v
    values = sampling_logprobs(wide, every.reshape(-1), distribution).reshape(5, 64)
    tempered = torch.log_softmax(logits / distribution.temperature, dim=-1)
    assert torch.isfinite(values).all()
    for position in range(5):
        kept = torch.tensor(sorted(_reference_kept(logits[position].double() / distribution.temperature,
                                                   distribution)))  # fmt: skip
        outside = torch.ones(64, dtype=torch.bool)
        outside[kept] = False
        assert torch.logsumexp(values[position, kept], dim=0).abs() < 1e-5
        assert torch.allclose(values[position, outside], tempered[position, outside], atol=1e-5)
        if outside.any():
            assert values[position, outside].max() <= values[position, kept].min()


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=repr)
def test_gradient_matches_the_reference(distribution):
    logits = (torch.randn(2, 7, 30, generator=torch.Generator().manual_seed(2)) * 3).requires_grad_(True)
    targets = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(3))
    weights = torch.randn(2, 7, generator=torch.Generator().manual_seed(4))
    (sampling_logprobs(logits, targets, distribution) * weights).sum().backward()
    reference = logits.detach().double().requires_grad_(True)
    total = 0.0
    for b in range(2):
        for t in range(7):
            x = reference[b, t] / distribution.temperature
            kept = sorted(_reference_kept(x.detach(), distribution))
            target = int(targets[b, t])
            support = kept if target in kept else list(range(30))
            total = total + weights[b, t].double() * (x[target] - torch.logsumexp(x[support], dim=0))
    total.backward()
    assert torch.allclose(logits.grad, reference.grad.float(), atol=1e-5)


@pytest.mark.parametrize("distribution", [None, SamplingDistribution(), SamplingDistribution(top_k=-1)])
def test_the_plain_path_is_token_logprobs_bit_for_bit(distribution):
    logits = torch.randn(3, 9, 50, generator=torch.Generator().manual_seed(5)).requires_grad_(True)
    twin = logits.detach().clone().requires_grad_(True)
    targets = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(6))
    got, expected = sampling_logprobs(logits, targets, distribution), token_logprobs(twin, targets)
    assert torch.equal(got, expected)
    got.sum().backward()
    expected.sum().backward()
    assert torch.equal(logits.grad, twin.grad)
    assert torch.equal(sampling_logprobs(logits[0], targets[0], distribution), expected[0])


def test_shapes_bfloat16_and_empty_batches():
    d = SamplingDistribution(temperature=0.7, top_p=0.9)
    logits = torch.randn(2, 4, 16)
    targets = torch.randint(0, 16, (2, 4))
    assert sampling_logprobs(logits[1], targets[1], d).shape == (4,)
    assert torch.equal(sampling_logprobs(logits[1], targets[1], d), sampling_logprobs(logits, targets, d)[1])
    low = sampling_logprobs(logits.bfloat16(), targets, d)
    assert low.dtype == torch.float32 and torch.allclose(low, sampling_logprobs(logits.bfloat16().float(), targets, d))
    assert sampling_logprobs(torch.zeros(0, 4, 7), torch.zeros(0, 4, dtype=torch.long), d).shape == (0, 4)
    with pytest.raises(ValueError, match="targets"):
        sampling_logprobs(logits, targets[0], d)


def test_distribution_checks_its_values_and_knows_when_it_is_plain():
    assert SamplingDistribution().is_plain and SamplingDistribution(top_k=-1).is_plain
    assert not SamplingDistribution(temperature=0.9).is_plain and not SamplingDistribution(top_k=1).is_plain
    assert not SamplingDistribution(top_p=0.99).is_plain
    for bad in ({"temperature": 0.0}, {"temperature": float("nan")}, {"top_k": -2}, {"top_k": 1.5},
                {"top_p": 0.0}, {"top_p": 1.1}):  # fmt: skip
        with pytest.raises(ConfigError):
            SamplingDistribution(**bad)


def test_distribution_of_the_engines_sampling_options():
    sampling = SamplingConfig(temperature=0.7, top_k=20, top_p=0.8, seed=3, max_tokens=9)
    assert SamplingDistribution.of(sampling) == SamplingDistribution(temperature=0.7, top_k=20, top_p=0.8)
    assert SamplingDistribution.of({"top_p": 0.9}) == SamplingDistribution(top_p=0.9)
    assert SamplingDistribution.of({"logit_bias": {}, "repetition_penalty": 1.0}).is_plain
    with pytest.raises(ConfigError, match="min_p"):
        SamplingDistribution.of(SamplingConfig(min_p=0.1))
    with pytest.raises(ConfigError, match="temperature"):
        SamplingDistribution.of({"temperature": 0.0})


def test_engine_logprobs_mode_reaches_vllm_under_its_own_name():
    assert VLLMEngineConfig(model="m").logprobs_mode == "raw"
    assert _llm_kwargs(VLLMEngineConfig(model="m"))["logprobs_mode"] == "raw_logprobs"
    assert _llm_kwargs(VLLMEngineConfig(model="m", logprobs_mode="processed"))["logprobs_mode"] == "processed_logprobs"
    assert VLLMEngineConfig(model="m", logprobs_mode="processed_logprobs").logprobs_mode == "processed"
    with pytest.raises(ConfigError, match="logprobs_mode"):
        VLLMEngineConfig(model="m", logprobs_mode="processed_logits")
