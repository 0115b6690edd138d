"""Gradients of one GRPO step over rows split unevenly across ranks, and the same step in one process.

Imported by the tests, and run as a script by each gloo rank (`python grad_parity.py OUT`, with the torchrun
variables set): the rank trains its share of `rank_rows` for every case of `CASES` and saves the gradients the
optimizer would step on, with its reported metrics, to OUT.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any

import torch

from agentic_rl.train import sharding as fsdp_units
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.lora import LoRAConfig
from agentic_rl.train.sharding import unshard_tensor
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.types import RunRecorder, Step, StepTrajectory

PAD = 2
# (loss_agg_mode, kl_coef, rank 1's rewards): rank 1 rewards (1, 1) give its only group advantage 0, so it computes
# no row but its tokens still count in the normalizers.
CASES = [(mode, kl, rewards) for mode in ("token-mean", "sequence-mean")
         for kl, rewards in ((0.0, (1.0, 0.0)), (0.1, (1.0, 0.0)), (0.0, (1.0, 1.0)))]  # fmt: skip
# A case whose gradient norm is clipped to `CLIP_NORM` (below its norm): the sharded clip scales by the global norm.
CLIPPED = ("token-mean", 0.1, (1.0, 0.0))
# Step-level advantages (a row per turn), sharded only.
STEP_OPTIONS = {"advantage": "step", "gamma": 0.9}
CLIP_NORM = 1e-3


def tiny_model() -> torch.nn.Module:
    """The tiny random SmolLM2 in float32."""
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)


def trajectory(idx: int, reward: float, task_id: str, runs: Sequence[Sequence[int]]) -> StepTrajectory:
    """A trajectory whose k-th token run has turns of `runs[k]` sampled tokens each (turns of one run joined by
    observation tokens; each run opens with its own prompt, as when memory rewrote the history); seeded by `idx`."""
    g = torch.Generator().manual_seed(idx)

    def ids(n: int) -> list[int]:
        return torch.randint(100, 4000, (n,), generator=g).tolist()

    recorder, steps = RunRecorder(), []
    for turns in runs:
        recorder.start(ids(5))
        for i, n in enumerate(turns):
            if i:
                recorder.insert(ids(2))
            run, span = recorder.sample(ids(n), (-torch.rand(n, generator=g) * 3).tolist(), 0)
            steps.append(Step(run=run, span=span, reward=0.25 * ((idx + i) % 3)))  # step mode learns from these
    steps[-1].reward = reward
    return StepTrajectory.from_runs(recorder.runs, idx=idx, trajectory_reward=reward, steps=steps,
                                    task={"id": task_id}, failed=False)  # fmt: skip


def rank_rows(rank: int, rank1_rewards: Sequence[float]) -> list[StepTrajectory]:
    """Rank 0: groups `a` and `b`, 5 trajectories of 12 sampled tokens in two runs (60 tokens, 10 rows, 5 sequences);
    rank 1: group `c`, 2 one-turn trajectories of 3 tokens (6 tokens, 2 rows, 2 sequences). A group is on one rank."""
    if rank == 0:
        rewards = {"a": (1.0, 0.0, 0.25), "b": (0.0, 1.0)}
        return [trajectory(10 * i + j, r, task, [[4, 3], [5]])
                for i, (task, rs) in enumerate(rewards.items()) for j, r in enumerate(rs)]  # fmt: skip
    return [trajectory(100 + j, r, "c", [[3]]) for j, r in enumerate(rank1_rewards)]


def reference_of(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of `model` with every parameter moved a little (so the k3 KL has a gradient at the start)."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.sin(torch.arange(p.numel(), dtype=p.dtype)).view_as(p))
    return ref


def step_gradients(model: torch.nn.Module, trajectories: Sequence[StepTrajectory], case: tuple, *,
                   micro_batch_size: int, dist: DistContext | None = None, sharding: str = "replicate",
                   max_grad_norm: float = 1e9, lora: bool = False,
                   **options: Any) -> tuple[list[torch.Tensor], dict[str, Any]]:  # fmt: skip
    """The gradients (one per parameter, whole, after the all-reduce or reduce-scatter, and clipping) one
    `train_step` of a copy of `model` steps on, and its metrics."""
    mode, kl_coef, _ = case
    config = GRPOConfig(lr=1e-3, micro_batch_size=micro_batch_size, loss_agg_mode=mode, kl_coef=kl_coef,
                        max_grad_norm=max_grad_norm, sharding=sharding,
                        lora=LoRAConfig(rank=4, alpha=8.0) if lora else None, **options)  # fmt: skip
    policy = copy.deepcopy(model)
    torch.manual_seed(0)  # the adapter's A: one process's, and rank 0's (which every rank gets)
    reference = reference_of(model) if kl_coef else None
    trainer = GRPOTrainer(policy, pad_token_id=PAD, config=config, reference=reference, dist=dist)
    seen: list[list[torch.Tensor]] = []
    step = trainer.optimizer.step

    def record(*args: Any, **kwargs: Any) -> Any:
        seen.append([unshard_tensor(p.grad).clone() for p in trainer.module.parameters() if p.requires_grad])
        return step(*args, **kwargs)

    trainer.optimizer.step = record
    stats = trainer.train_step(trajectories).as_metrics()
    assert len(seen) == 1, "the step was skipped"
    return seen[0], stats


def relative_difference(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """|got - want| / |want| over all parameters together (2-norms)."""
    diff = torch.cat([(g - w).flatten() for g, w in zip(got, want, strict=True)])
    return float(diff.norm() / torch.cat([w.flatten() for w in want]).norm())


# The memory levers across two ranks: (sharding, case, options, LoRA). Each is held against one process's fp32
# gradient of the case: exactly (<= 1e-5) for activation checkpointing and CPU offload, within `BF16_TOLERANCE` for
# bf16 compute or a bf16 reduce.
LEVER_CASES = [
    ("fsdp", CASES[4], {"activation_checkpointing": True}, False),
    ("fsdp", CASES[1], {"cpu_offload": True}, False),
    ("fsdp", CASES[1], {"precision": "bf16"}, False),
    ("fsdp", CASES[4], {"precision": "bf16", "reduce_dtype": "bf16", "activation_checkpointing": True}, False),
    ("fsdp", CLIPPED, {"precision": "bf16", "activation_checkpointing": True, "cpu_offload": True}, True),
    ("replicate", CASES[1], {"precision": "bf16", "reduce_dtype": "bf16", "activation_checkpointing": True}, False),
]
BF16_TOLERANCE = 3e-2


def lever_tolerance(options: dict[str, Any]) -> float:
    """How far a lever's gradient may be from fp32's (relative): bf16 rounds, checkpointing and offload do not."""
    return BF16_TOLERANCE if "bf16" in options.values() else 1e-5


def main(out: str, sharding: str = "replicate") -> None:
    """Join the gloo group from the environment and save this rank's gradients and metrics of every case to `out`,
    the model held as `sharding` says; sharded, three more cases: a clipped gradient (`CLIPPED`), a LoRA adapter
    and step-level advantages (`STEP_OPTIONS`)."""
    from agentic_rl.train.distributed import init_from_env

    if sharding == "solo":  # one process, no torchrun: cpu_offload shards over a group of its own
        solo(out)
        return
    ctx = init_from_env("cpu", timeout_s=120)
    model = tiny_model()
    if sharding == "levers":
        levers(out, ctx, model)
        return
    if sharding == "weights":
        gathered_weights(out, ctx, model)
        return
    results = []
    for case in CASES:
        grads, stats = step_gradients(model, rank_rows(ctx.rank, case[2]), case, micro_batch_size=2, dist=ctx,
                                      sharding=sharding)  # fmt: skip
        results.append({"grads": grads, "loss": stats["loss"], "grad_norm": stats["grad_norm"]})
    if sharding == "fsdp":
        grads, stats = step_gradients(model, rank_rows(ctx.rank, CLIPPED[2]), CLIPPED, micro_batch_size=2, dist=ctx,
                                      sharding=sharding, max_grad_norm=CLIP_NORM)  # fmt: skip
        results.append({"grads": grads, "loss": stats["loss"], "grad_norm": stats["grad_norm"]})
        grads, stats = step_gradients(model, rank_rows(ctx.rank, CLIPPED[2]), CLIPPED, micro_batch_size=2, dist=ctx,
                                      sharding=sharding, lora=True)  # fmt: skip
        results.append({"grads": grads, "loss": stats["loss"], "grad_norm": stats["grad_norm"]})
        grads, stats = step_gradients(model, rank_rows(ctx.rank, CASES[0][2]), CASES[0], micro_batch_size=2, dist=ctx,
                                      sharding=sharding, **STEP_OPTIONS)  # fmt: skip
        results.append({"grads": grads, "loss": stats["loss"], "grad_norm": stats["grad_norm"]})
    torch.save(results, out)
    ctx.close()


def levers(out: str, ctx: DistContext, model: torch.nn.Module) -> None:
    """Each of `LEVER_CASES` on this rank's rows; the gradients, losses and norms saved to `out`."""
    results = []
    for sharding, case, options, lora in LEVER_CASES:
        grads, stats = step_gradients(model, rank_rows(ctx.rank, case[2]), case, micro_batch_size=2, dist=ctx,
                                      sharding=sharding, lora=lora, **options)  # fmt: skip
        results.append({"grads": grads, "loss": stats["loss"], "grad_norm": stats["grad_norm"]})
    torch.save(results, out)
    ctx.close()


def count_calls(obj: Any, method: str, counts: list[int], k: int) -> None:
    """Make `obj.method` add 1 to `counts[k]` on each call."""
    inner = getattr(obj, method)

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[k] += 1
        return inner(*args, **kwargs)

    setattr(obj, method, counted)


def gathered_weights(out: str, ctx: DistContext, model: torch.nn.Module) -> None:
    """After one sharded step (fp32, then bf16 mixed precision): `named_weights()` collected whole into a list,
    beside each parameter gathered alone, saved to `out`."""
    results = []
    for precision in ("fp32", "bf16"):
        config = GRPOConfig(lr=1e-3, micro_batch_size=2, sharding="fsdp", precision=precision)
        trainer = GRPOTrainer(copy.deepcopy(model), pad_token_id=PAD, config=config, dist=ctx)
        trainer.train_step(rank_rows(ctx.rank, CASES[0][2]))
        units = fsdp_units._units(trainer.module)
        gathers = [0] * len(units)
        for k, unit in enumerate(units):  # count each unit's gathers during the sync
            count_calls(unit, "unshard", gathers, k)
        listed = list(trainer.named_weights())  # kept whole after the iteration: copies, not freed unit storage
        counted = list(gathers)
        alone = [(name, unshard_tensor(p)) for name, p in trainer.module.named_parameters()]
        results.append({"listed": listed, "alone": alone, "by_unit": not any(map(fsdp_units._gathers_cast, units)),
                        "gathers": counted})  # fmt: skip
    torch.save(results, out)
    ctx.close()


def solo(out: str) -> None:
    """One process with `sharding: fsdp` and `cpu_offload` over all rows of `CASES[1]`: its gradients, and whether
    the trainer made a group of its own (closed here)."""
    case = CASES[1]
    rows = [*rank_rows(0, case[2]), *rank_rows(1, case[2])]
    config = GRPOConfig(lr=1e-3, micro_batch_size=4, loss_agg_mode=case[0], kl_coef=case[1], sharding="fsdp",
                        cpu_offload=True, max_grad_norm=1e9)  # fmt: skip
    trainer = GRPOTrainer(tiny_model(), pad_token_id=PAD, config=config, reference=reference_of(tiny_model()))
    seen = []
    step = trainer.optimizer.step

    def record(*args: Any, **kwargs: Any) -> Any:
        seen.append([unshard_tensor(p.grad).clone() for p in trainer.module.parameters() if p.requires_grad])
        return step(*args, **kwargs)

    trainer.optimizer.step = record
    trainer.train_step(rows)
    torch.save({"grads": seen[0], "sharded": trainer.sharded, "world_size": trainer.dist.world_size}, out)
    trainer.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
