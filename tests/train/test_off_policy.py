"""Decoupled PPO in `grpo_loss` (truncated and masked importance weights) and the packed weight versions.

Every expected value below is worked out by hand from the formulas in `train.off_policy` and `grpo_loss`.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agentic_rl.errors import ConfigError
from agentic_rl.train.advantages import batch_advantages
from agentic_rl.train.loss import LOG_RATIO_MAX, grpo_loss, response_logprobs
from agentic_rl.train.off_policy import OffPolicyConfig, lag_sums
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.types import StepTrajectory, TokenRun

CORRECTIONS = [OffPolicyConfig(correction="tis", tis_cap=1.5), OffPolicyConfig(correction="mask"),
               OffPolicyConfig(correction="mask", mask_level="sequence")]  # fmt: skip


def _inputs(seed: int = 0, rows: int = 5, width: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 4
    mask = (torch.rand(rows, width, generator=g) > 0.25).float()
    mask[1] = 0.0  # a row without response tokens
    return {"new": old + torch.randn(rows, width, generator=g), "old": old, "mask": mask,
            "adv": torch.randn(rows, generator=g) * 2}  # fmt: skip


def _loss_and_grad(inputs: dict[str, torch.Tensor], **kwargs):
    new = inputs["new"].clone().requires_grad_(True)
    out = grpo_loss(new, inputs["old"], inputs["adv"], inputs["mask"], **kwargs)
    out.loss.backward()
    return out, new.grad


@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean"])
def test_none_is_plain_ppo_on_the_engine_ratio_bit_for_bit(mode):
    inputs = _inputs()
    new = inputs["new"].clone().requires_grad_(True)
    seq = torch.tensor([0, 1, 1, 2, 3])
    kwargs = {"loss_agg_mode": mode, "sequence_ids": seq, "clip_ratio_c": 3.0}
    out = grpo_loss(new, inputs["old"], inputs["adv"], inputs["mask"], off_policy=OffPolicyConfig(correction="none"),
                    proximal_logprobs=inputs["old"] + 5.0, **kwargs)  # fmt: skip
    out.loss.backward()
    plain, plain_grad = _loss_and_grad(inputs, **kwargs)  # no `off_policy`: the loss as it always was
    assert torch.equal(out.loss, plain.loss) and torch.equal(new.grad, plain_grad)
    for name in ("pg_loss", "kl", "clip_fraction", "dual_clip_fraction", "approx_kl_old"):
        assert torch.equal(getattr(out, name), getattr(plain, name)), name
    # the PPO formula written out (token-mean): ratio new / old, clipped, dual-clipped
    if mode == "token-mean":
        on = inputs["mask"].bool()
        adv = inputs["adv"][:, None].expand_as(inputs["new"])
        ratio = torch.exp(torch.clamp(torch.where(on, inputs["new"] - inputs["old"], 0.0), max=LOG_RATIO_MAX))
        j = torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
        j = torch.where((adv < 0) & (3.0 * adv > j), 3.0 * adv, j)
        assert torch.equal(out.loss, torch.where(on, -j, 0.0).sum() / inputs["mask"].sum())
    assert out.is_truncated_fraction.item() == 0.0 and out.is_masked_fraction.item() == 0.0


@pytest.mark.parametrize("config", CORRECTIONS, ids=lambda c: f"{c.correction}-{c.mask_level}")
@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean"])
def test_a_proximal_policy_equal_to_the_behaviour_one_gives_the_on_policy_loss_and_gradient(config, mode):
    inputs = _inputs(seed=1)
    kwargs = {"loss_agg_mode": mode, "sequence_ids": torch.tensor([0, 0, 1, 2, 2])}
    out, grad = _loss_and_grad(inputs, off_policy=config, proximal_logprobs=inputs["old"], **kwargs)
    plain, plain_grad = _loss_and_grad(inputs, **kwargs)
    assert torch.equal(out.loss, plain.loss) and torch.equal(grad, plain_grad)  # w = 1: nothing truncated or masked
    assert out.clip_fraction.item() == plain.clip_fraction.item() > 0  # the ratio new / prox is clipped as before
    assert out.is_weight_mean.item() == out.is_weight_max.item() == 1.0
    assert out.is_truncated_fraction.item() == out.is_masked_fraction.item() == 0.0


def _weights_case(w: list[list[float]], adv: list[float]):
    """new = -1 everywhere, old = new - log w: the proximal policy (new, detached) is w times the behaviour one."""
    new = torch.full((len(w), len(w[0])), -1.0, requires_grad=True)
    mask = torch.tensor([[1.0 if x > 0 else 0.0 for x in row] for row in w])
    old = torch.where(mask.bool(), -1.0 - torch.log(torch.tensor(w).clamp(min=1e-9)), 0.0)
    return new, old, torch.tensor(adv), mask


def test_tis_truncates_the_weight_at_the_cap_and_scales_the_gradient():
    # row 0, A = +1: w = 4 (-> 2), 1, 0.5; row 1, A = -1: w = 3 (-> 2), no second token
    new, old, adv, mask = _weights_case([[4.0, 1.0, 0.5], [3.0, 0.0, 0.0]], [1.0, -1.0])
    out = grpo_loss(new, old, adv, mask, off_policy=OffPolicyConfig(correction="tis", tis_cap=2.0))
    out.loss.backward()
    # r = new / new.detach() = 1: J = w' * A, unclipped; pg = -(2 + 1 + 0.5 - 2) / 4
    assert out.loss.item() == pytest.approx(-1.5 / 4)
    # dJ/dnew = w' * A * r = w' * A
    torch.testing.assert_close(new.grad, torch.tensor([[-2 / 4, -1 / 4, -0.5 / 4], [2 / 4, 0.0, 0.0]]))
    assert out.is_truncated_fraction.item() == pytest.approx(2 / 4) and out.is_masked_fraction.item() == 0.0
    assert out.is_weight_mean.item() == pytest.approx((4 + 1 + 0.5 + 3) / 4) and out.is_weight_max.item() == 4.0
    assert out.clip_fraction.item() == 0.0  # one step from the proximal policy: the ratio is 1


def test_token_level_mask_zeroes_the_tokens_whose_weight_is_out_of_bounds():
    new, old, adv, mask = _weights_case([[4.0, 1.0, 1.5, 0.25]], [1.0])
    out = grpo_loss(new, old, adv, mask, off_policy=OffPolicyConfig(correction="mask", mask_low=0.5, mask_high=2.0))
    out.loss.backward()
    # w = 4 and 0.25 are out of [0.5, 2]: J = (0, 1, 1.5, 0) * A; both masked tokens still count in the mean
    assert out.loss.item() == pytest.approx(-2.5 / 4)
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -1 / 4, -1.5 / 4, 0.0]]))
    assert out.is_masked_fraction.item() == pytest.approx(2 / 4) and out.is_truncated_fraction.item() == 0.0


def test_sequence_level_mask_judges_the_geometric_mean_weight_of_each_whole_sequence():
    w = [[4.0, 0.5], [4.0, 2.0], [0.25, 0.0]]
    config = OffPolicyConfig(correction="mask", mask_level="sequence", mask_low=0.5, mask_high=2.0)
    # every row its own sequence: geometric means sqrt(2) (kept), sqrt(8) > 2 (masked), 0.25 < 0.5 (masked)
    new, old, adv, mask = _weights_case(w, [1.0, 1.0, 1.0])
    out = grpo_loss(new, old, adv, mask, off_policy=config)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-(4 + 0.5) / 5)
    torch.testing.assert_close(new.grad, torch.tensor([[-4 / 5, -0.5 / 5], [0.0, 0.0], [0.0, 0.0]]))
    assert out.is_masked_fraction.item() == pytest.approx(3 / 5)
    # rows 1 and 2 one sequence (the runs of one trajectory): w = 4, 2, 0.25, geometric mean 2^(1/3): kept
    new, old, adv, mask = _weights_case(w, [1.0, 1.0, 1.0])
    out = grpo_loss(new, old, adv, mask, off_policy=config, sequence_ids=torch.tensor([0, 1, 1]))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-(4 + 0.5 + 4 + 2 + 0.25) / 5)
    torch.testing.assert_close(new.grad, torch.tensor([[-4 / 5, -0.5 / 5], [-4 / 5, -2 / 5], [-0.25 / 5, 0.0]]))
    assert out.is_masked_fraction.item() == 0.0


def test_the_weight_is_a_constant_and_a_far_off_policy_token_stays_finite():
    # log w = 200 nats: bounded at 20 before exp, then truncated; the gradient flows through the ratio alone
    new = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-201.0, -1.0]])
    out = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), off_policy=OffPolicyConfig(tis_cap=2.0))
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.is_weight_max.item() == pytest.approx(math.exp(LOG_RATIO_MAX), rel=1e-6)
    torch.testing.assert_close(new.grad, torch.tensor([[-2 / 2, -1 / 2]]))


def test_off_policy_settings_are_checked():
    for bad in ({"tis_cap": 0.9}, {"mask_low": 0.0}, {"mask_low": 1.0}, {"mask_high": 1.0}, {"correction": "is"}):
        with pytest.raises(ConfigError, match="OffPolicyConfig"):
            OffPolicyConfig(**bad)
    with pytest.raises(ConfigError, match="off_policy.tis_cap"):
        GRPOConfig.model_validate({"off_policy": {"tis_cap": 0.5}})
    assert GRPOConfig().off_policy == OffPolicyConfig(correction="tis", tis_cap=2.0)


def _versioned(idx: int, runs: list[TokenRun], *, failed: bool = False) -> StepTrajectory:
    return StepTrajectory.from_runs(runs, idx=idx, trajectory_reward=float(idx % 2), task={"id": "t"}, failed=failed)


def test_packed_weight_versions_follow_the_trained_tokens_through_select_and_give_the_lags():
    # run 0: versions 3, 3, inserted, 5, 5; run 1: not recorded; a failed trajectory's versions are not trained
    a = TokenRun([7, 8], [10, 11, 12, 13, 14], [1, 1, 0, 1, 1], [-0.5, -1.0, 0.0, -1.5, -2.0], [3, 3, -1, 5, 5])
    b = TokenRun([7], [20, 21], [1, 1], [-0.25, -0.75], None)
    c = TokenRun([7], [30], [1], [-1.0], [4])
    batch = pack_trajectories([_versioned(0, [a]), _versioned(1, [b]), _versioned(2, [c], failed=True)],
                              pad_token_id=0)  # fmt: skip
    assert batch.weight_versions.dtype == torch.int64
    assert batch.weight_versions.tolist() == [[3, 3, -1, 5, 5], [-1, -1, -1, -1, -1], [-1, -1, -1, -1, -1]]
    micro = batch.select(torch.tensor([1, 0]), trim=True)
    assert micro.weight_versions.tolist() == [[-1, -1, -1, -1, -1], [3, 3, -1, 5, 5]]

    ones = torch.ones_like(batch.old_logprobs)
    assert lag_sums(ones, batch.weight_versions, batch.response_mask, 5) == {0: (2.0, 2), 2: (2.0, 2)}
    gap = lag_sums(-batch.old_logprobs, batch.weight_versions, batch.response_mask, 6)
    assert gap == {1: (pytest.approx(3.5), 2), 3: (pytest.approx(1.5), 2)}
    assert lag_sums(ones, batch.weight_versions, batch.response_mask, None) == {}
    unknown = pack_trajectories([_versioned(0, [b])], pad_token_id=0)
    assert lag_sums(ones[:1, :2], unknown.weight_versions, unknown.response_mask, 5) == {}


def _made_up(idx: int, versions: list[int] | None) -> StepTrajectory:
    """One run: 3 prompt tokens, 6 response tokens (the third inserted), made-up engine logprobs within 1.2 nats of
    the tiny random model's (about -10.9: its vocabulary is 49152 tokens)."""
    g = torch.Generator().manual_seed(idx)
    ids = torch.randint(100, 4000, (9,), generator=g).tolist()
    logprobs = (torch.rand(6, generator=g) * 2.4 - 12.1).tolist()
    logprobs[2] = 0.0
    return _versioned(idx, [TokenRun(ids[:3], ids[3:], [1, 1, 0, 1, 1, 1], logprobs, versions)])


def test_train_step_reports_tokens_and_logprob_gap_by_lag_and_the_importance_weights(tiny):
    trajs = [_made_up(0, [5, 5, -1, 6, 6, 6]), _made_up(1, [4, 4, -1, 4, 5, 5]), _made_up(2, None),
             _made_up(3, [6, 6, -1, 6, 6, 6])]  # fmt: skip
    batch = pack_trajectories(trajs, pad_token_id=2)
    with torch.no_grad():
        new = response_logprobs(tiny.eval(), batch)
    gaps = (new - batch.old_logprobs).abs()
    on = batch.response_mask.bool()
    w = torch.exp(new - batch.old_logprobs)[on]
    whole = grpo_loss(new, batch.old_logprobs, batch_advantages(batch), batch.response_mask,
                      off_policy=GRPOConfig().off_policy)  # fmt: skip
    trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=2, config=GRPOConfig(lr=1e-3, micro_batch_size=3))
    stats = trainer.train_step(trajs, weight_version=6).as_metrics()
    assert stats["loss"] == pytest.approx(whole.loss.item(), rel=1e-4, abs=1e-6)  # micro-batches of 3 rows, or one

    # lags of the sampled tokens with a known version: 0 (version 6), 1 (5), 2 (4); trajectory 2 has none
    assert stats["lag_tokens"] == {0: 8, 1: 4, 2: 3} and stats["tokens_trained"] == 20
    for lag, version in ((0, 6), (1, 5), (2, 4)):
        want = gaps[on & (batch.weight_versions == version)].mean().item()
        assert stats["lag_logprob_gap"][lag] == pytest.approx(want, rel=1e-4)
    assert stats["logprob_diff"] == pytest.approx(gaps[on].mean().item(), rel=1e-4)
    assert stats["is_weight_mean"] == pytest.approx(w.mean().item(), rel=1e-4)
    assert stats["is_weight_max"] == pytest.approx(w.max().item(), rel=1e-4)
    # some made-up engine logprobs are more than log 2 below the model's: their weights pass the cap of 2
    surely, maybe = int((w > 2 * (1 + 1e-4)).sum()), int((w > 2 * (1 - 1e-4)).sum())
    truncated = round(stats["is_truncated_fraction"] * 20)
    assert stats["is_truncated_fraction"] == pytest.approx(truncated / 20) and 0 < surely <= truncated <= maybe < 20
    assert stats["is_masked_fraction"] == 0.0 and math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])

    unversioned = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=2).train_step(trajs).as_metrics()
    assert unversioned["lag_tokens"] == {} and unversioned["lag_logprob_gap"] == {}


def _two_runs(idx: int, logprobs: tuple[list[float], list[float]] | None = None) -> StepTrajectory:
    """Two runs of 4 sampled tokens each (memory rewrote the history in between), with the given engine logprobs."""
    ids = torch.randint(100, 4000, (14,), generator=torch.Generator().manual_seed(idx)).tolist()
    first, second = logprobs or ([-1.0] * 4, [-1.0] * 4)
    return _versioned(idx, [TokenRun(ids[:3], ids[3:7], [1] * 4, first, [0] * 4),
                            TokenRun(ids[7:10], ids[10:], [1] * 4, second, [0] * 4)])  # fmt: skip


def test_sequence_level_masking_keeps_a_trajectorys_runs_in_one_micro_batch(tiny):
    # each trajectory's first run is e^1 times likelier under the model than the engine said (alone: masked, e > 2),
    # its second e^-0.5 times (kept); together the geometric mean is e^0.25: kept
    probe = pack_trajectories([_two_runs(i) for i in range(4)], pad_token_id=2)
    with torch.no_grad():
        new = response_logprobs(tiny.eval(), probe)
    trajs = [_two_runs(i, ((new[2 * i] - 1.0).tolist(), (new[2 * i + 1] + 0.5).tolist())) for i in range(4)]
    batch = pack_trajectories(trajs, pad_token_id=2)
    config = OffPolicyConfig(correction="mask", mask_level="sequence")
    per_row = grpo_loss(new, batch.old_logprobs, batch_advantages(batch), batch.response_mask, off_policy=config)
    assert per_row.is_masked_fraction.item() == 0.5  # had each run been judged alone

    trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=2,
                          config=GRPOConfig(lr=1e-3, micro_batch_size=1, off_policy=config))  # fmt: skip
    stats = trainer.train_step(trajs).as_metrics()
    assert stats["is_masked_fraction"] == 0.0 and stats["is_weight_max"] == pytest.approx(math.e, rel=1e-3)
    config = OffPolicyConfig(correction="mask", mask_level="token")
    trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=2,
                          config=GRPOConfig(lr=1e-3, micro_batch_size=1, off_policy=config))  # fmt: skip
    assert trainer.train_step(trajs).as_metrics()["is_masked_fraction"] == pytest.approx(0.5)
