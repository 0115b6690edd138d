"""`GRPOTrainer.train_step` on the tiny random model: token accounting, micro-batching, skipped optimizer steps."""

from __future__ import annotations

import copy

import pytest
import torch
from grad_parity import CASES, rank_rows, relative_difference, step_gradients

from agentic_rl.errors import TrainingError
from agentic_rl.train.advantages import batch_advantages
from agentic_rl.train.loss import grpo_loss, response_logprobs
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.types import RunRecorder, Step, StepTrajectory

PAD = 2


def _rewritten(idx: int, reward: float, *, task_id: str = "t", failed: bool = False) -> StepTrajectory:
    """Three turns in two runs (memory rewrote the history before turn 2); 4 + 3 + 5 = 12 sampled tokens."""
    g = torch.Generator().manual_seed(idx)

    def ids(n: int) -> list[int]:
        return torch.randint(100, 4000, (n,), generator=g).tolist()

    def lps(n: int) -> list[float]:
        return (-torch.rand(n, generator=g) * 4).tolist()

    p0, r0, glue, r1, p2, r2 = ids(6), ids(4), ids(3), ids(3), ids(9), ids(5)
    recorder, steps = RunRecorder(), []
    recorder.start(p0)
    for response, n, glue_after in ((r0, 4, glue), (r1, 3, None)):
        run, span = recorder.sample(response, lps(n), 0)
        steps.append(Step(run=run, span=span))
        if glue_after:
            recorder.insert(glue_after)
    recorder.start(p2)
    run, span = recorder.sample(r2, lps(5), 0)
    steps.append(Step(run=run, span=span))
    return StepTrajectory.from_runs(recorder.runs, idx=idx, trajectory_reward=reward, steps=steps,
                                    task={"id": task_id}, failed=failed)  # fmt: skip


def _batch() -> list[StepTrajectory]:
    return [_rewritten(0, 1.0), _rewritten(1, 0.0), _rewritten(2, 0.5), _rewritten(3, 1.0, failed=True),
            _rewritten(4, 0.0, task_id="u"), _rewritten(5, 1.0, task_id="u")]  # fmt: skip


@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean"])
def test_micro_batching_changes_nothing_and_every_run_is_counted(tiny, mode):
    trajs = _batch()
    batch = pack_trajectories(trajs, pad_token_id=PAD)
    adv = batch_advantages(batch)
    with torch.no_grad():
        new = response_logprobs(tiny.eval(), batch)
    whole = grpo_loss(new, batch.old_logprobs, adv, batch.response_mask, loss_agg_mode=mode,
                      sequence_ids=batch.row_trajectory)  # fmt: skip

    stats = []
    for micro in (1, 3, 64):
        config = GRPOConfig(lr=1e-3, micro_batch_size=micro, loss_agg_mode=mode, off_policy={"correction": "none"})
        trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=PAD, config=config)
        stats.append(trainer.train_step(trajs).as_metrics())
    for s in stats:
        assert s["loss"] == pytest.approx(whole.loss.item(), rel=1e-4, abs=1e-6)
        assert s["clip_fraction"] == pytest.approx(whole.clip_fraction.item(), abs=1e-6)
        assert s["dual_clip_fraction"] == pytest.approx(whole.dual_clip_fraction.item(), abs=1e-6)
        assert s["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-3)
        # 6 trajectories x 12 sampled tokens; the failed one's 12 are excluded; 5 valid x 2 runs are trained
        assert (s["tokens_sampled"], s["tokens_trained"], s["tokens_excluded"], s["tokens_excluded_failed"]) == (
            72, 60, 12, 12)  # fmt: skip
        assert s["tokens"] == 60 and s["valid_rows"] == 10 and s["valid_trajectories"] == 5
        assert s["response_length"] == 12.0
        assert s["step_skipped"] == 0 and s["skipped_steps"] == 0
    assert whole.clip_fraction.item() > 0  # the made-up old logprobs are far off-policy: the clips are exercised


def test_a_step_on_task_groups_is_the_step_on_their_trajectories_with_group_ids(tiny):
    """`train_step(groups)` (what the scheduler hands a step) trains exactly `train_step(trajectories, group_ids=...)`
    with each group's position as its id, and returns the same `StepStats`."""
    from agentic_rl.errors import TrajectoryError
    from agentic_rl.train.groups import TrajectoryGroup

    trajs = _batch()
    groups = [TrajectoryGroup(0, 0, {"id": "t"}, list(trajs[:4])), TrajectoryGroup(0, 1, {"id": "u"}, list(trajs[4:]))]
    config = GRPOConfig(lr=1e-3, micro_batch_size=3)
    by_groups = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=PAD, config=config)
    by_ids = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=PAD, config=config)
    a = by_groups.train_step(groups, weight_version=0).as_metrics()
    b = by_ids.train_step(trajs, group_ids=[0, 0, 0, 0, 1, 1], weight_version=0).as_metrics()
    assert {k: v for k, v in a.items() if k != "train_seconds"} == {k: v for k, v in b.items() if k != "train_seconds"}
    assert all(torch.equal(p, q) for p, q in zip(by_groups.module.parameters(), by_ids.module.parameters(), strict=True))
    with pytest.raises(TrajectoryError, match="not both"):
        by_groups.train_step(groups, group_ids=[0, 0, 0, 0, 1, 1])


@pytest.mark.parametrize("case", [case for case in CASES if case[2] == (1.0, 0.0)], ids=str)
def test_micro_batches_of_uneven_token_counts_step_on_the_one_batch_gradient(tiny, case):
    """Rows of 3, 5 and 7 response tokens in micro-batches of 1 to 5 rows (3 to 31 tokens): each weighs a token (or a
    sequence) by 1 / the step's count, as one batch of every row does, with and without a KL term."""
    rows = [*rank_rows(1, case[2]), *rank_rows(0, case[2])]  # the short one-turn trajectories first
    want, _ = step_gradients(tiny, rows, case, micro_batch_size=64)
    for size in (1, 2, 3, 5):
        got, _ = step_gradients(tiny, rows, case, micro_batch_size=size)
        assert relative_difference(got, want) <= 1e-5, (case, size)


def test_skipped_steps_are_reported_and_too_many_in_a_row_stop_training(tiny, caplog):
    model = copy.deepcopy(tiny)
    trainer = GRPOTrainer(model, pad_token_id=PAD, config=GRPOConfig(lr=1e-2, max_consecutive_skips=2))
    trajs = _batch()
    weight = model.model.norm.weight

    def poison():  # a non-finite gradient, as an overflowing model or loss would produce
        return weight.register_hook(lambda g: torch.full_like(g, float("nan")))

    before = [p.detach().clone() for p in model.parameters()]
    handle = poison()
    first = trainer.train_step(trajs).as_metrics()
    assert first["step_skipped"] == 1 and first["skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # weights untouched
    assert "optimizer step skipped" in caplog.text
    handle.remove()

    second = trainer.train_step(trajs).as_metrics()
    assert second["step_skipped"] == 0 and second["skipped_steps"] == 1 and trainer.consecutive_skips == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    handle = poison()
    third = trainer.train_step(trajs).as_metrics()
    assert third["step_skipped"] == 1 and third["skipped_steps"] == 2 and trainer.consecutive_skips == 1
    with pytest.raises(TrainingError, match="2 optimizer steps in a row were skipped"):
        trainer.train_step(trajs)
    handle.remove()
    assert trainer.skipped_steps == 3


def test_config_bounds_of_the_new_settings():
    from agentic_rl.errors import ConfigError

    assert GRPOConfig().clip_ratio_c == 3.0 and GRPOConfig().max_consecutive_skips == 3
    for bad in ({"clip_ratio_c": 1.0}, {"max_consecutive_skips": 0}, {"max_response_length": 0}):
        with pytest.raises(ConfigError):
            GRPOConfig(**bad)


def test_response_logprobs_through_the_last_columns_only_equal_the_full_forward_and_its_gradient(tiny):
    """`logits_to_keep` runs the output head on the response columns only; values and gradients stay the same."""

    class FullHead(torch.nn.Module):  # the same model without a `logits_to_keep` argument: every column's logits
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, position_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)

    model = copy.deepcopy(tiny).eval()
    batch = pack_trajectories(_batch(), pad_token_id=PAD)
    kept = response_logprobs(model, batch)
    (kept * batch.response_mask).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full = response_logprobs(FullHead(model), batch)
    (full * batch.response_mask).sum().backward()
    assert kept.shape == full.shape == batch.responses.shape
    torch.testing.assert_close(kept, full, rtol=0, atol=1e-5)
    for a, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


def test_a_trimmed_micro_batch_drops_only_padding_and_keeps_every_logprob(tiny):
    """Rows of different lengths: a micro-batch of the short ones computes over their own width only."""
    model = copy.deepcopy(tiny).eval()
    batch = pack_trajectories([_rewritten(0, 1.0), _rewritten(1, 0.0)], pad_token_id=PAD)  # rows: 6+10, 9+5 tokens
    for rows in (torch.tensor([0]), torch.tensor([1]), torch.tensor([1, 3]), torch.arange(batch.input_ids.shape[0])):
        full, trimmed = batch.select(rows), batch.select(rows, trim=True)
        p, r = trimmed.prompt_width, trimmed.responses.shape[1]
        lead = full.prompt_width - p
        assert 1 <= p <= full.prompt_width and r <= full.responses.shape[1]
        # only all-padding columns went away
        assert not full.attention_mask[:, :lead].any() and not full.attention_mask[:, full.prompt_width + r :].any()
        assert torch.equal(trimmed.input_ids, full.input_ids[:, lead : full.prompt_width + r])
        assert torch.equal(trimmed.response_mask, full.response_mask[:, :r])
        with torch.no_grad():
            a, b = response_logprobs(model, full)[:, :r], response_logprobs(model, trimmed)
        on = trimmed.response_mask.bool()
        torch.testing.assert_close(b[on], a[on], rtol=0, atol=1e-5)
    assert batch.select(torch.tensor([1]), trim=True).input_ids.shape[1] < batch.input_ids.shape[1]


def _recorded_step_grads(trainer: GRPOTrainer) -> list[list[torch.Tensor]]:
    seen: list[list[torch.Tensor]] = []
    step = trainer.optimizer.step

    def record(*args, **kwargs):
        seen.append([p.grad.clone() for p in trainer.module.parameters()])
        return step(*args, **kwargs)

    trainer.optimizer.step = record
    return seen


def test_rows_with_zero_advantage_are_not_computed_and_the_gradient_is_the_full_batchs(tiny):
    """Without a KL term a row of advantage 0 adds nothing: skipping its forward leaves loss and gradient as they were."""
    trajs = [*_batch(), _rewritten(6, 1.0, task_id="z"), _rewritten(7, 1.0, task_id="z")]  # group z: advantage 0
    model = copy.deepcopy(tiny).train()
    batch = pack_trajectories(trajs, pad_token_id=PAD)
    adv = batch_advantages(batch)
    whole = grpo_loss(response_logprobs(model, batch, share_prefix=False), batch.old_logprobs, adv,
                      batch.response_mask, sequence_ids=batch.row_trajectory, off_policy=GRPOConfig().off_policy)  # fmt: skip
    whole.loss.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    trainer = GRPOTrainer(model, pad_token_id=PAD, config=GRPOConfig(lr=1e-3, micro_batch_size=3, max_grad_norm=1e9))
    seen = _recorded_step_grads(trainer)
    stats = trainer.train_step(trajs).as_metrics()
    # group z's 2 x 2 rows, and the 2 rows of group t's trajectory whose reward (0.5) is its group's mean
    assert stats["valid_rows"] == 14 and stats["zero_advantage_rows"] == 6 and stats["tokens"] == 84
    assert stats["loss"] == pytest.approx(whole.loss.item(), rel=1e-4, abs=1e-6)
    assert len(seen) == 1
    for got, want in zip(seen[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def test_a_batch_of_zero_advantage_rows_still_takes_its_optimizer_step(tiny):
    trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=PAD, config=GRPOConfig(lr=1e-3))
    seen = _recorded_step_grads(trainer)
    stats = trainer.train_step([_rewritten(0, 1.0), _rewritten(1, 1.0)]).as_metrics()
    assert stats["zero_advantage_rows"] == stats["valid_rows"] == 4 and stats["grad_norm"] == 0.0
    assert stats["logprob_diff"] is None  # no row computed: the gap was not measured (0.0 would claim a match)
    assert len(seen) == 1 and all(not g.any() for g in seen[0])  # a zero gradient, as computing the rows gives


def test_overlong_filtering_trains_the_rest_of_the_group_with_the_cut_ones_rewards(tiny):
    """With `overlong_filter` the step's gradient is that of the unfiltered batch with the cut trajectories' tokens
    masked (their rewards kept in the group statistics); off, a cut trajectory trains like any other."""
    from agentic_rl.train.off_policy import OffPolicyConfig
    from agentic_rl.train.step_rows import StepRows

    trajs = _batch()
    trajs[0].termination_reason = "truncated"
    trajs[4].termination_reason = "context_limit"
    none = OffPolicyConfig(correction="none")
    batch = pack_trajectories(trajs, pad_token_id=PAD)
    adv = batch_advantages(batch)
    mask = batch.response_mask * ~torch.isin(batch.row_trajectory, torch.tensor([0, 4]))[:, None]
    reference = copy.deepcopy(tiny).train()
    new = response_logprobs(reference, batch)
    grpo_loss(new, batch.old_logprobs, adv, mask, off_policy=none, normalizer=float(mask.sum())).loss.backward()
    for overlong_filter in (False, True):
        config = GRPOConfig(lr=1e-3, micro_batch_size=4, off_policy=none, overlong_filter=overlong_filter)
        trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=PAD, config=config)
        packed, _ = trainer._pack(trajs, None)
        advantages = batch_advantages(packed)
        for i in range(len(trajs)):  # the cut ones' rewards count either way: every trajectory's advantage is the same
            assert advantages[packed.row_trajectory == i].unique().tolist() == pytest.approx(
                adv[batch.row_trajectory == i].unique().tolist())  # fmt: skip
        trainer._accumulate_gradients(packed, advantages, StepRows.of(packed, advantages, with_kl=False, dist=None))
        if overlong_filter:
            for p, q in zip(trainer.module.parameters(), reference.parameters(), strict=True):
                assert p.grad is not None and torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-8)
        s = trainer.train_step(trajs).as_metrics()
        assert s["tokens_sampled"] == s["tokens_trained"] + s["tokens_excluded"] == 72
        assert s["tokens_excluded_overlong"] == (24 if overlong_filter else 0) and s["tokens_excluded_failed"] == 12
        assert s["valid_trajectories"] == 5  # the cut ones stay in their groups' statistics
