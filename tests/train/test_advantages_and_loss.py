"""GRPO advantages and the clipped policy loss."""

from __future__ import annotations

import math

import pytest
import torch

from agentic_rl.errors import ConfigError, TrajectoryError
from agentic_rl.train.advantages import group_advantages
from agentic_rl.train.loss import grpo_loss, token_logprobs


def test_group_advantages_normalize_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups, torch.ones(6, dtype=torch.bool))
    assert adv[:4].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-4)
    assert adv[4:].tolist() == [0.0, 0.0]  # identical rewards: no signal


def test_near_constant_group_gives_bounded_advantages():
    rewards = torch.tensor([0.35] * 7 + [0.95])
    adv = group_advantages(rewards, torch.zeros(8, dtype=torch.long), torch.ones(8, dtype=torch.bool))
    assert adv.abs().max() < 3.0
    assert adv[-1] == pytest.approx(0.525 / math.sqrt(0.039375), rel=1e-3)
    tiny = torch.tensor([0.5] * 7 + [0.5001])
    adv_tiny = group_advantages(tiny, torch.zeros(8, dtype=torch.long), torch.ones(8, dtype=torch.bool))
    assert adv_tiny.abs().max() < 0.01  # the std floor stops a 1e-4 difference from becoming +-2.6


def test_invalid_rows_are_excluded_from_group_statistics_and_get_zero():
    rewards = torch.tensor([1.0, 0.0, 100.0, float("nan")])
    valid = torch.tensor([True, True, False, False])
    adv = group_advantages(rewards, torch.zeros(4, dtype=torch.long), valid)
    assert adv.tolist()[:2] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert adv.tolist()[2:] == [0.0, 0.0]


def test_unscaled_variant_only_subtracts_the_group_mean():
    adv = group_advantages(torch.tensor([3.0, 1.0]), torch.tensor([0, 0]), torch.ones(2, dtype=torch.bool),
                           scale_by_std=False)  # fmt: skip
    assert adv.tolist() == [1.0, -1.0]


def test_nan_reward_on_a_valid_row_is_an_error():
    with pytest.raises(TrajectoryError, match="NaN"):
        group_advantages(torch.tensor([float("nan"), 1.0]), torch.tensor([0, 0]), torch.ones(2, dtype=torch.bool))


def test_token_logprobs_match_log_softmax():
    logits = torch.randn(2, 3, 11)
    targets = torch.randint(0, 11, (2, 3))
    expected = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_gradient_matches_log_softmax(dtype):
    logits = torch.randn(3, 5, 17).to(dtype).requires_grad_(True)
    reference = logits.detach().clone().requires_grad_(True)
    targets = torch.randint(0, 17, (3, 5))
    weights = torch.randn(3, 5)
    (token_logprobs(logits, targets) * weights).sum().backward()
    (torch.log_softmax(reference.float(), -1).gather(-1, targets[..., None])[..., 0] * weights).sum().backward()
    assert logits.grad.dtype == dtype
    assert torch.allclose(logits.grad.float(), reference.grad.float(), atol=1e-6 if dtype == torch.float32 else 1e-2)


def test_token_logprobs_of_an_empty_batch_is_empty():
    assert token_logprobs(torch.zeros(0, 4, 7), torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4)


def test_loss_equals_negative_advantage_weighted_ratio_on_policy():
    new = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = new.detach().clone()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = grpo_loss(new, old, torch.tensor([2.0]), mask)
    assert out.loss.item() == pytest.approx(-2.0)  # ratio 1 on every unmasked token
    out.loss.backward()
    assert new.grad[0].tolist() == pytest.approx([-1.0, -1.0, 0.0])  # d(-A*ratio)/d(new) / n_tokens
    assert out.clip_fraction.item() == 0.0


def test_ratio_is_clipped_for_positive_advantages_above_one_plus_eps():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_()
    out = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    assert out.loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
    assert out.clip_fraction.item() == pytest.approx(0.5)


def test_k3_kl_is_zero_at_the_reference_and_positive_elsewhere():
    new = torch.tensor([[-1.0, -1.0]])
    zero = grpo_loss(new, new, torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=new, kl_coef=0.1)
    assert zero.kl.item() == pytest.approx(0.0)
    away = grpo_loss(new, new, torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=new - 0.5, kl_coef=0.1)
    assert away.kl.item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert away.loss.item() == pytest.approx(0.1 * away.kl.item())


def test_sequence_mean_weights_sequences_equally():
    new = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    token = grpo_loss(new, new.detach(), adv, mask, loss_agg_mode="token-mean").loss.item()
    seq = grpo_loss(new, new.detach(), adv, mask, loss_agg_mode="sequence-mean").loss.item()
    assert token == pytest.approx((-1 + 4) / 5) and seq == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        grpo_loss(new, new.detach(), adv, mask, loss_agg_mode="bogus")  # type: ignore[arg-type]
