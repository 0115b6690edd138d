"""Two gloo ranks on 127.0.0.1: `init_from_env` under a launcher other than torchrun (rank 0 serves the group's store
one port above MASTER_PORT), and a GRPO step over rows split unevenly across the ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from grad_parity import (
    CASES,
    CLIP_NORM,
    CLIPPED,
    STEP_OPTIONS,
    rank_rows,
    relative_difference,
    step_gradients,
    tiny_model,
)
from support.launch import run_gloo_ranks

from agentic_rl.train.lora import LoRAConfig, wrap_model

# Each rank joins from the environment a launcher sets, averages its rank's value, checks a shard of 0..5 and leaves.
_RANK = """
from agentic_rl.train.distributed import init_from_env, shard
import torch
ctx = init_from_env("cpu", timeout_s=60)
values = torch.tensor([float(ctx.rank)])
ctx.allreduce_mean_([values])
print(ctx.rank, ctx.world_size, ctx.backend, values.item(), shard(list(range(6)), ctx))
ctx.close()
"""


# An in-process engine's shutdown (vLLM's `destroy_process_group()`, no argument) destroys every registered group,
# the training group too: leaving it afterwards is then a no-op, not an error.
_ENGINE_CLOSED_FIRST = """
import datetime
import torch.distributed as dist
from agentic_rl.train.distributed import init_from_env
ctx = init_from_env("cpu", timeout_s=60)
store = dist.HashStore()
dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
dist.destroy_process_group()
ctx.close()
print("closed", ctx.group)
"""


def test_leaving_the_group_after_the_engine_destroyed_every_group_is_quiet():
    outputs = run_gloo_ranks(["-c", _ENGINE_CLOSED_FIRST], timeout_s=120)
    assert [out.strip() for out in outputs] == ["closed None", "closed None"]


def test_ranks_started_without_torchrun_join_one_gloo_group():
    outputs = run_gloo_ranks(["-c", _RANK], timeout_s=120)
    assert [out.strip() for out in outputs] == ["0 2 gloo 0.5 [0, 2, 4]", "1 2 gloo 0.5 [1, 3, 5]"]


def test_two_ranks_with_uneven_rows_step_on_the_single_process_gradient(tmp_path):
    """Rank 0 trains 60 tokens (5 sequences), rank 1 trains 6 (2): every token (`token-mean`) or sequence
    (`sequence-mean`) weighs 1 / its global count, so the averaged gradient is one process's over all rows, with and
    without a KL term, and when rank 1's rows are all skipped (advantage 0) but still counted."""
    run_gloo_ranks([str(Path(__file__).with_name("grad_parity.py")), str(tmp_path / "rank{rank}.pt")], timeout_s=600)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    model = tiny_model()
    for i, case in enumerate(CASES):
        rows = [*rank_rows(0, case[2]), *rank_rows(1, case[2])]
        want, stats = step_gradients(model, rows, case, micro_batch_size=64)
        for rank in ranks:
            assert relative_difference(rank[i]["grads"], want) <= 1e-5, case
            assert rank[i]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-5), case
        # the reported loss is each rank's own mean: rank 1's is what one process reports over rank 1's rows alone
        if case[2] == (1.0, 0.0):
            _, alone = step_gradients(model, rank_rows(1, case[2]), case, micro_batch_size=64)
            assert ranks[1][i]["loss"] == pytest.approx(alone["loss"], rel=1e-5, abs=1e-7), case


def test_two_sharded_ranks_with_uneven_rows_step_on_the_single_process_gradient(tmp_path):
    """FSDP2 over the gloo group (`optimizer.sharding: fsdp`): the same uneven rows, so rank 1 pads its micro-batches
    with idle passes (5 against rank 0's 5 real ones, or 4 and 1), and the gathered gradient is still one process's,
    in both loss modes, with and without KL, clipped by the global norm, and for a LoRA adapter on the sharded frozen
    base (its KL reference the base itself), and for step-level advantages."""
    script = [str(Path(__file__).with_name("grad_parity.py")), str(tmp_path / "rank{rank}.pt"), "fsdp"]
    run_gloo_ranks(script, timeout_s=600)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    model = tiny_model()
    n = len(CASES)
    for i, case in enumerate([*CASES, CLIPPED, CLIPPED, CASES[0]]):
        rows = [*rank_rows(0, case[2]), *rank_rows(1, case[2])]
        clip = CLIP_NORM if i == n else 1e9
        want, stats = step_gradients(model, rows, case, micro_batch_size=64, max_grad_norm=clip, lora=i == n + 1,
                                     **(STEP_OPTIONS if i == n + 2 else {}))  # fmt: skip
        for rank in ranks:
            assert relative_difference(rank[i]["grads"], want) <= 1e-5, case
            assert rank[i]["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-5), case
        if i == n:
            assert stats["grad_norm"] > 10 * CLIP_NORM  # this case was clipped
    adapter = [p for p in wrap_model(tiny_model(), LoRAConfig(rank=4, alpha=8.0)).parameters() if p.requires_grad]
    assert len(ranks[0][n + 1]["grads"]) == len(adapter)  # the LoRA case trained its adapter only
