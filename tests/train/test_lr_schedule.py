"""Learning-rate schedules: each optimizer step trains at the rate its schedule gives it (skipped steps count), the
rate is the one the update used, and a checkpoint resumes the schedule where it stopped."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support.train_runs import answer_group, write_train_config

from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import load_train_config
from agentic_rl.train.checkpoints import weights_digest
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

LR = 1e-3


def _cosine(step: int, *, decay: int, floor: float, warmup: int = 0) -> float:
    """The rate of 0-based optimizer step `step`, written out from the `GRPOConfig.lr_schedule` docstring."""
    if step < warmup:
        return LR * step / warmup
    progress = min(1.0, (step - warmup) / (decay - warmup))
    return LR * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _trainer(model, tokenizer, **config) -> GRPOTrainer:
    return GRPOTrainer(copy.deepcopy(model), pad_token_id=tokenizer.pad_token_id,
                       config=GRPOConfig(lr=LR, micro_batch_size=4, **config))  # fmt: skip


def test_each_step_trains_at_the_cosine_rate_and_a_step_without_a_trained_row_still_moves_it(tiny, tokenizer):
    signal, constant = answer_group(tiny, tokenizer, [1.0, 0.0, 1.0]), answer_group(tiny, tokenizer, [1.0] * 3)
    trainer = _trainer(tiny, tokenizer, lr_schedule="cosine", lr_decay_steps=4, min_lr_ratio=0.25)
    rates = []
    for batch in (signal, constant, signal, signal, signal, signal):
        metrics = trainer.train_step(batch).as_metrics()
        rates.append(metrics["lr"])
        assert (metrics["zero_advantage_rows"] == 3) == (batch is constant)  # the constant group trains no row
    assert rates == pytest.approx([_cosine(k, decay=4, floor=0.25) for k in range(6)], rel=1e-9)
    # from the peak, half way down at the middle (0.25 + 0.75 / 2), to the floor, where it stays
    assert rates[0] == LR and rates[2] == pytest.approx(0.625 * LR) and rates[4] == rates[5] == pytest.approx(0.25 * LR)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.25 * LR)  # what AdamW stepped with


def test_warmup_starts_at_zero_so_the_first_update_leaves_the_weights_as_they_were(tiny, tokenizer):
    group = answer_group(tiny, tokenizer, [1.0, 0.0, 1.0])
    trainer = _trainer(tiny, tokenizer, lr_warmup_steps=2)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # the optimizer holds step 0's rate from the start
    start = weights_digest(trainer.module)
    rates = [trainer.train_step(group).as_metrics()["lr"]]
    assert weights_digest(trainer.module) == start  # AdamW at rate 0, without weight decay, moves nothing
    rates += [trainer.train_step(group).as_metrics()["lr"] for _ in range(3)]
    assert rates == pytest.approx([0.0, LR / 2, LR, LR])
    assert weights_digest(trainer.module) != start

    warm = _trainer(tiny, tokenizer, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=4, min_lr_ratio=0.5)
    rates = [warm.train_step(group).as_metrics()["lr"] for _ in range(5)]
    assert rates == pytest.approx([_cosine(k, decay=4, floor=0.5, warmup=2) for k in range(5)])
    assert rates[2] == pytest.approx(LR) and rates[4] == pytest.approx(LR / 2)


def test_a_resumed_trainer_continues_the_schedule_and_takes_the_same_step(tiny, tokenizer):
    """The schedule follows `steps_done`, which `state_dict` holds: a fresh trainer loaded from it after two steps
    (weights copied as the loop's checkpoint does) trains its third step at the third rate, to the same weights."""
    first, second = answer_group(tiny, tokenizer, [1.0, 0.0, 1.0]), answer_group(tiny, tokenizer, [0.0, 1.0], offset=5)
    settings = {"lr_schedule": "cosine", "lr_decay_steps": 3, "min_lr_ratio": 0.1}
    uninterrupted = _trainer(tiny, tokenizer, **settings)
    uninterrupted.train_step(first)
    uninterrupted.train_step(second)
    state = copy.deepcopy(uninterrupted.state_dict())
    weights = copy.deepcopy(uninterrupted.module.state_dict())
    third = uninterrupted.train_step(first).as_metrics()

    resumed = _trainer(tiny, tokenizer, **settings)
    resumed.module.load_state_dict(weights)
    resumed.load_state_dict(state)
    assert resumed.steps_done == 2
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(_cosine(1, decay=3, floor=0.1))  # saved
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(_cosine(2, decay=3, floor=0.1))  # the next one
    assert resumed.train_step(first).as_metrics()["lr"] == third["lr"] == pytest.approx(_cosine(2, decay=3, floor=0.1))
    assert weights_digest(resumed.module) == weights_digest(uninterrupted.module)


def test_schedule_settings_that_cannot_work_or_would_be_ignored_are_refused_by_name(tiny, tmp_path):
    path = write_train_config(tmp_path)  # 2 steps
    assert load_train_config(path, ["optimizer.lr_schedule=cosine"]).optimizer.lr_decay_steps is None  # the run's
    with pytest.raises(ConfigError, match=r"optimizer\.lr_warmup_steps=2 must be below steps=2"):
        load_train_config(path, ["optimizer.lr_warmup_steps=2"])
    with pytest.raises(ConfigError, match=r"lr_warmup_steps=4 must be below lr_decay_steps=4"):
        load_train_config(path, ["steps=9", "optimizer.lr_schedule=cosine", "optimizer.lr_warmup_steps=4",
                                 "optimizer.lr_decay_steps=4"])  # fmt: skip
    for settings, named in ((["optimizer.min_lr_ratio=0.1"], r"min_lr_ratio=0\.1 only shapes"),
                            (["optimizer.lr_decay_steps=5"], r"lr_decay_steps=5 only shapes"),
                            (["optimizer.min_lr_ratio=0.1", "optimizer.lr_decay_steps=5"],
                             r"min_lr_ratio=0\.1 and lr_decay_steps=5 only shape the cosine schedule")):  # fmt: skip
        with pytest.raises(ConfigError, match=named):
            load_train_config(path, settings)
    for bad in ({"min_lr_ratio": 1.5}, {"min_lr_ratio": float("nan")}, {"min_lr_ratio": True},
                {"lr_decay_steps": True}, {"lr_warmup_steps": True}, {"lr": float("inf")}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(bad))):
            GRPOConfig(lr_schedule="cosine", **bad)
    with pytest.raises(ConfigError, match=r"lr_schedule"):
        GRPOConfig(lr_schedule="linear")
    model = copy.deepcopy(tiny)
    with pytest.raises(ConfigError, match=r"cosine needs lr_decay_steps"):
        GRPOTrainer(model, pad_token_id=0, config=GRPOConfig(lr_schedule="cosine", lora={"rank": 4}))
    assert not any("lora_" in name for name, _ in model.named_parameters())  # refused before the adapter went in


def test_a_step_skipped_for_its_gradient_reports_the_schedules_rate_and_the_next_step_takes_the_next_one(tiny, tokenizer):
    group = answer_group(tiny, tokenizer, [1.0, 0.0, 1.0])
    trainer = _trainer(tiny, tokenizer, lr_schedule="cosine", lr_decay_steps=3, min_lr_ratio=0.5)
    trainer.train_step(group)
    start = weights_digest(trainer.module)
    handle = trainer.module.model.norm.weight.register_hook(lambda g: torch.full_like(g, float("nan")))
    skipped = trainer.train_step(group).as_metrics()
    handle.remove()
    assert skipped["step_skipped"] == 1 and weights_digest(trainer.module) == start  # no update at this rate
    assert skipped["lr"] == trainer.optimizer.param_groups[0]["lr"] == pytest.approx(_cosine(1, decay=3, floor=0.5))
    assert trainer.train_step(group).as_metrics()["lr"] == pytest.approx(_cosine(2, decay=3, floor=0.5))
    assert weights_digest(trainer.module) != start
