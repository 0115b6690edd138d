"""The trainer's memory levers (`train.levers`): activation checkpointing and CPU offload change no gradient, bf16
compute and a bf16 reduce stay within `BF16_TOLERANCE` of fp32, whole, sharded over two gloo ranks and on one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from grad_parity import (
    BF16_TOLERANCE,
    CASES,
    CLIPPED,
    LEVER_CASES,
    PAD,
    lever_tolerance,
    rank_rows,
    reference_of,
    relative_difference,
    step_gradients,
    tiny_model,
)
from support.launch import ROOT, run_gloo_ranks

from agentic_rl.errors import ConfigError
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

SCRIPT = str(Path(__file__).with_name("grad_parity.py"))


def _rows(case: tuple) -> list:
    return [*rank_rows(0, case[2]), *rank_rows(1, case[2])]


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CLIPPED])
@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_leaves_the_gradient_unchanged(case, lora):
    model = tiny_model()
    want, plain = step_gradients(model, _rows(case), case, micro_batch_size=4, lora=lora)
    got, checkpointed = step_gradients(model, _rows(case), case, micro_batch_size=4, lora=lora,
                                       activation_checkpointing=True)  # fmt: skip
    assert relative_difference(got, want) <= 1e-6
    assert checkpointed["loss"] == pytest.approx(plain["loss"], rel=1e-6)


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CLIPPED])
def test_bf16_compute_stays_near_fp32(case):
    model = tiny_model()
    want, fp32 = step_gradients(model, _rows(case), case, micro_batch_size=4)
    got, bf16 = step_gradients(model, _rows(case), case, micro_batch_size=4, precision="bf16")
    difference = relative_difference(got, want)
    assert 0 < difference <= BF16_TOLERANCE  # rounded (so bf16 really ran), but close
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=BF16_TOLERANCE, abs=1e-6)


def test_bf16_keeps_fp32_master_weights_and_a_bf16_reference():
    config = GRPOConfig(precision="bf16", kl_coef=0.1, lr=1e-3)
    trainer = GRPOTrainer(tiny_model(), pad_token_id=PAD, config=config)
    assert {p.dtype for p in trainer.module.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.reference.parameters()} == {torch.bfloat16}
    trainer.train_step(_rows(CASES[1]))
    assert all(s["exp_avg"].dtype == torch.float32 for s in trainer.optimizer.state.values())


def test_levers_that_need_what_is_missing_are_refused():
    with pytest.raises(ValueError, match="cpu_offload keeps FSDP2 shards in host memory"):
        GRPOConfig(cpu_offload=True)

    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match="Plain has no per-layer checkpointing"):
        GRPOTrainer(Plain(), pad_token_id=0, config=GRPOConfig(activation_checkpointing=True))


def test_levers_over_two_ranks_keep_the_single_process_gradient(tmp_path):
    """Rows split unevenly over two gloo ranks (rank 1 pads with idle passes when sharded), each lever of
    `LEVER_CASES` against one process's fp32 gradient over all rows."""
    run_gloo_ranks([SCRIPT, str(tmp_path / "rank{rank}.pt"), "levers"], timeout_s=600)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    model = tiny_model()
    for i, (sharding, case, options, lora) in enumerate(LEVER_CASES):
        want, stats = step_gradients(model, _rows(case), case, micro_batch_size=64, lora=lora)
        for rank in ranks:
            assert relative_difference(rank[i]["grads"], want) <= lever_tolerance(options), (sharding, options)
        assert ranks[0][i]["grad_norm"] == pytest.approx(ranks[1][i]["grad_norm"], rel=1e-6)


def test_cpu_offload_on_one_process_shards_over_a_group_of_its_own(tmp_path):
    out = tmp_path / "solo.pt"
    subprocess.run([sys.executable, SCRIPT, str(out), "solo"], check=True, cwd=ROOT, timeout=300,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    got = torch.load(out)
    assert got["sharded"] and got["world_size"] == 1
    want, _ = step_gradients(tiny_model(), _rows(CASES[1]), CASES[1], micro_batch_size=4)
    assert relative_difference(got["grads"], want) <= 1e-5


def test_a_given_reference_is_kept_as_given():
    reference = reference_of(tiny_model())
    trainer = GRPOTrainer(tiny_model(), pad_token_id=PAD, reference=reference,
                          config=GRPOConfig(precision="bf16", kl_coef=0.1))  # fmt: skip
    assert trainer.reference is reference and {p.dtype for p in reference.parameters()} == {torch.float32}


def test_a_sync_from_shards_reads_the_master_weights_unit_by_unit(tmp_path):
    """`named_weights()` of a sharded trainer gathers one FSDP unit at a time in fp32 (one parameter at a time under
    bf16 mixed precision, whose units gather in bf16): the same names, order and fp32 values as gathering each
    parameter alone, on both ranks, and tensors that stay valid after the iteration."""
    run_gloo_ranks([SCRIPT, str(tmp_path / "rank{rank}.pt"), "weights"], timeout_s=600)
    for rank in (0, 1):
        cases = torch.load(tmp_path / f"rank{rank}.pt")
        assert [case["by_unit"] for case in cases] == [True, False]  # fp32 by unit; bf16 gathers cast: alone
        assert set(cases[0]["gathers"]) == {1}  # each unit gathered once, the root (first and last) too
        for case in cases:
            assert [n for n, _ in case["listed"]] == [n for n, _ in case["alone"]]
            for (_, got), (_, want) in zip(case["listed"], case["alone"], strict=True):
                assert got.dtype == torch.float32 and torch.equal(got, want)
