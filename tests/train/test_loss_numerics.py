"""`grpo_loss` at the edges: huge and tiny ratios, far-apart logprobs, large advantages, all-masked rows.

Every expected value below is worked out by hand from the formulas in `grpo_loss`'s docstring.
"""

from __future__ import annotations

import math

import pytest
import torch

from agentic_rl.errors import ConfigError
from agentic_rl.train.loss import LOG_RATIO_MAX, grpo_loss


def _finite(out, new: torch.Tensor) -> None:
    assert torch.isfinite(out.loss), out.loss
    out.loss.backward()
    assert new.grad is not None and bool(torch.isfinite(new.grad).all()), new.grad


def test_dual_clip_bounds_a_negative_advantage_token_with_a_huge_ratio():
    # advantage -1, one token at ratio e^8, two on-policy tokens
    old = torch.zeros(1, 3)
    new = torch.tensor([[8.0, 0.0, 0.0]], requires_grad=True)
    out = grpo_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 3), clip_ratio_c=3.0)
    # token 0: min(e^8 * -1, 1.2 * -1) = -e^8, dual clip max(-e^8, 3 * -1) = -3 -> pg 3; tokens 1, 2: pg 1
    assert out.loss.item() == pytest.approx((3 + 1 + 1) / 3)
    _finite(out, new)
    # Without the dual clip token 0 would pull with e^8 / 3 ~ 993; now it gets no gradient, the others -A / 3.
    assert new.grad[0].tolist() == pytest.approx([0.0, 1 / 3, 1 / 3])
    assert out.clip_fraction.item() == pytest.approx(1 / 3)
    assert out.dual_clip_fraction.item() == pytest.approx(1 / 3)


def test_extreme_ratios_and_advantages_give_a_finite_loss_and_exact_clip_counts():
    big = 1.0e4
    # row 0, A = +1e4:  log-ratio +100 (clipped high), -100 (ratio ~0: unclipped branch), +20 (clipped high), 0
    # row 1, A = -1e4:  log-ratio +100 (dual clip), -100 (clipped low), -20 (clipped low), log 2 (unclipped)
    # row 2: no response tokens at all, and a NaN logprob under the mask
    old = torch.tensor([[-100.0, 0.0, -21.0, -0.5], [-100.0, 0.0, -1.0, -math.log(2.0)], [0.0, 0.0, 0.0, 0.0]])
    new = torch.tensor([[0.0, -100.0, -1.0, -0.5], [0.0, -100.0, -21.0, 0.0], [float("nan"), -1.0, -1.0, -1.0]],
                       requires_grad=True)  # fmt: skip
    mask = torch.tensor([[1.0] * 4, [1.0] * 4, [0.0] * 4])
    adv = torch.tensor([big, -big, 123.0])
    out = grpo_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)

    row0 = -1.2 * big - math.exp(-100) * big - 1.2 * big - big
    row1 = 3 * big + 0.8 * big + 0.8 * big + 2 * big
    assert out.loss.item() == pytest.approx((row0 + row1) / 8, rel=1e-5)
    _finite(out, new)
    grad = torch.zeros(3, 4)
    grad[0, 3] = -big / 8  # on-policy token of row 0: d(-A * ratio) / d new = -A
    grad[1, 3] = 2 * big / 8  # ratio 2 inside (1 + clip_high, c): unclipped, -A * 2
    assert torch.allclose(new.grad, grad, atol=1e-3), new.grad
    assert out.clip_fraction.item() == pytest.approx(5 / 8)  # row 0: 2, row 1: 3
    assert out.dual_clip_fraction.item() == pytest.approx(1 / 8)
    assert out.approx_kl_old.item() == pytest.approx((-100 + 100 - 20 + 0 - 100 + 100 + 20 - math.log(2)) / 8, abs=1e-5)


def test_logprobs_near_zero_and_minus_one_hundred_with_sequence_mean():
    old = torch.tensor([[-1e-7, -100.0], [-100.0, -1e-7]])
    new = torch.tensor([[-100.0, -1e-7], [-1e-7, -100.0]], requires_grad=True)
    out = grpo_loss(new, old, torch.tensor([1.0, -1.0]), torch.ones(2, 2), loss_agg_mode="sequence-mean")
    # row 0 (A=1): ratio ~0 -> pg ~0; ratio e^100 -> clipped at 1.2 -> pg -1.2. row 1 (A=-1): dual clip -> 3; ratio ~0
    # -> clipped at 0.8 -> 0.8. sequence-mean: ((0 - 1.2) / 2 + (3 + 0.8) / 2) / 2
    assert out.loss.item() == pytest.approx(((-1.2) / 2 + 3.8 / 2) / 2, rel=1e-6)
    _finite(out, new)
    assert out.clip_fraction.item() == pytest.approx(3 / 4) and out.dual_clip_fraction.item() == pytest.approx(1 / 4)


def test_k3_kl_with_far_apart_logprobs_is_clamped_finite_and_counted():
    # d = ref - new per token: 94 (overflows exp unclamped), 0, -95, 10
    new = torch.tensor([[-95.0, -1.0, -1.0, -20.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, -96.0, -10.0]])
    out = grpo_loss(new, new.detach(), torch.tensor([0.0]), torch.ones(1, 4), ref_logprobs=ref, kl_coef=0.5)
    bound = LOG_RATIO_MAX
    k3 = [math.exp(bound) - bound - 1, 0.0, math.exp(-95) + 95 - 1, math.exp(10) - 10 - 1]
    assert out.kl.item() == pytest.approx(sum(k3) / 4, rel=1e-6)
    assert out.loss.item() == pytest.approx(0.5 * sum(k3) / 4, rel=1e-6)
    _finite(out, new)
    # d k3 / d new = 1 - e^d where not clamped; 0 on the clamped token
    expected = [0.0, 0.0, 0.5 * (1 - math.exp(-95)) / 4, 0.5 * (1 - math.exp(10)) / 4]
    assert new.grad[0].tolist() == pytest.approx(expected, rel=1e-5)
    assert out.kl_clamp_fraction.item() == pytest.approx(1 / 4)
    assert bound == 20.0


def test_policy_ratio_past_the_bound_stays_finite_even_with_zero_advantage():
    # exp(100) is inf in float32 and inf * 0 is NaN: the bound keeps a zero-advantage token at exactly 0
    new = torch.tensor([[0.0, -0.1]], requires_grad=True)
    old = torch.tensor([[-100.0, -0.1]])
    out = grpo_loss(new, old, torch.tensor([0.0]), torch.ones(1, 2))
    assert out.loss.item() == 0.0
    _finite(out, new)
    assert new.grad.abs().sum().item() == 0.0 and out.clip_fraction.item() == 0.0


def test_all_masked_batch_and_low_precision_inputs():
    new = torch.full((2, 3), -50.0, requires_grad=True)
    out = grpo_loss(new, torch.zeros(2, 3), torch.tensor([5.0, -5.0]), torch.zeros(2, 3),
                    ref_logprobs=torch.zeros(2, 3), kl_coef=1.0)  # fmt: skip
    assert out.loss.item() == 0.0 and out.clip_fraction.item() == 0.0 and out.kl.item() == 0.0
    _finite(out, new)
    assert new.grad.abs().sum().item() == 0.0
    for mode in ("token-mean", "sequence-mean"):
        half = torch.tensor([[-90.0, -1.0]], dtype=torch.bfloat16, requires_grad=True)
        out = grpo_loss(half, torch.tensor([[-1.0, -1.0]], dtype=torch.bfloat16), torch.tensor([-1.0]),
                        torch.ones(1, 2), ref_logprobs=torch.tensor([[-1.0, -1.0]]), kl_coef=0.1, loss_agg_mode=mode)  # fmt: skip
        assert out.loss.dtype == torch.float32
        _finite(out, half)


def test_sequence_ids_join_the_rows_of_one_trajectory_for_sequence_mean():
    new = torch.zeros(3, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    adv = torch.tensor([1.0, 1.0, -1.0])
    # rows 0 and 1 are two runs of one trajectory: its tokens -1, -1, -1 average to -1; row 2 averages to +1
    joined = grpo_loss(new, new.detach(), adv, mask, loss_agg_mode="sequence-mean", sequence_ids=torch.tensor([7, 7, 9]))
    assert joined.loss.item() == pytest.approx(0.0)
    apart = grpo_loss(new, new.detach(), adv, mask, loss_agg_mode="sequence-mean")
    assert apart.loss.item() == pytest.approx((-1 - 1 + 1) / 3)


def test_clip_ratio_c_must_exceed_one():
    x = torch.zeros(1, 1)
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        grpo_loss(x, x, torch.zeros(1), torch.ones(1, 1), clip_ratio_c=1.0)


def test_a_normalizer_divides_the_sums_so_uneven_parts_add_up_to_the_whole():
    """Row 0 holds 6 response tokens, row 1 one: with the whole batch's count as `normalizer`, the two rows' losses
    add up to the whole batch's (each token, or sequence, weighing 1 / that count), and so do their gradients."""
    new = torch.linspace(-3.0, -0.5, 14).view(2, 7).requires_grad_()
    old = torch.full((2, 7), -1.0)
    ref = torch.full((2, 7), -1.5)
    adv = torch.tensor([0.5, -2.0])
    mask = torch.tensor([[1.0] * 6 + [0.0], [1.0] + [0.0] * 6])
    for mode, count in (("token-mean", 7.0), ("sequence-mean", 2.0)):
        whole = grpo_loss(new, old, adv, mask, ref_logprobs=ref, kl_coef=0.1, loss_agg_mode=mode)
        (want,) = torch.autograd.grad(whole.loss, new)
        parts = [grpo_loss(new[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], ref_logprobs=ref[i : i + 1],
                           kl_coef=0.1, loss_agg_mode=mode, normalizer=count) for i in (0, 1)]  # fmt: skip
        (got,) = torch.autograd.grad(parts[0].loss + parts[1].loss, new)
        assert (parts[0].loss + parts[1].loss).item() == pytest.approx(whole.loss.item(), rel=1e-6)
        assert (parts[0].kl + parts[1].kl).item() == pytest.approx(whole.kl.item(), rel=1e-6)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("normalizer", [0.0, -1.0])
def test_normalizer_must_be_positive(normalizer):
    x = torch.zeros(1, 1)
    with pytest.raises(ConfigError, match="normalizer"):
        grpo_loss(x, x, torch.zeros(1), torch.ones(1, 1), normalizer=normalizer)
