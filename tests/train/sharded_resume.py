"""Sharded (FSDP2) training runs of a few GRPO steps that checkpoint, are killed while saving and resume.

Imported by the tests (`start_ranks`, `MODES`), and run as a script by each of two gloo ranks
(`python sharded_resume.py MODE OUT`, the torchrun variables set):

- `uninterrupted`: for full fine-tuning (`OUT/full`) and LoRA (`OUT/lora`): train step 1, save `checkpoints/step_1`
  (every rank: `save_sharded_checkpoint`), keep the gathered weights and AdamW moments of that moment (rank 0:
  `gathered_step_1.pt`, with their digest), train steps 2 and 3 and write the final weights' digest (`digest.txt`);
- `killed`: full fine-tuning into `OUT/full`: train step 1, save `step_1`, train step 2, and while saving `step_2`,
  once a rank's shards are written (before its DCP metadata), write `saving_rank{R}` and wait to be killed;
- `resumed`: for each of `OUT/full` and `OUT/lora` that holds checkpoints: what a resumed run does (`discard_partial`, `latest_checkpoint`,
  `restore_weights`) in fresh processes, then train the remaining steps to 3 and write `digest.txt`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from grad_parity import PAD, tiny_model, trajectory

from agentic_rl.train.checkpoints import (
    capture_rng_state,
    discard_partial,
    latest_checkpoint,
    load_state,
    weights_digest,
)
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.lora import LoRAConfig
from agentic_rl.train.sharded_checkpoints import save_sharded_checkpoint
from agentic_rl.train.sharding import unshard_tensor
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
MODES = ("uninterrupted", "killed", "resumed")


def start_ranks(args: list[str], log: Path, port: int) -> list[subprocess.Popen]:
    """Start `python sharded_resume.py ARGS...` as ranks 0 and 1 of a gloo group on 127.0.0.1 (launched without
    torchrun; `support.launch.free_port_pair` gives `port`), each rank's output into `log` with `.rank{R}` added."""
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}  # fmt: skip
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        with open(f"{log}.rank{rank}", "wb") as out:
            procs.append(subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=out,
                                          stderr=subprocess.STDOUT))  # fmt: skip
    return procs


def rows(rank: int, step: int) -> list:
    """Rank `rank`'s rows of step `step` (1-based): one group of three two-turn trajectories, seeded by both."""
    return [trajectory(1000 * step + 10 * rank + j, reward, f"s{step}r{rank}", [[4, 3], [2]])
            for j, reward in enumerate((1.0, 0.0, 0.5))]  # fmt: skip


def trainer(ctx: DistContext, lora: bool) -> GRPOTrainer:
    """A sharded trainer of the tiny model (with a KL term on the full model; an adapter of rank 4 with LoRA)."""
    config = GRPOConfig(lr=1e-2, micro_batch_size=2, sharding="fsdp", kl_coef=0.0 if lora else 0.05,
                        lora=LoRAConfig(rank=4, alpha=8.0) if lora else None)  # fmt: skip
    torch.manual_seed(0)
    return GRPOTrainer(tiny_model(), pad_token_id=PAD, config=config, dist=ctx)


def save(folder: Path, ctx: DistContext, learner: GRPOTrainer, step: int) -> None:
    """The checkpoint of `step` steps, as a run saves it (all ranks), with a training state like a run's."""
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("tiny-random-smollm2")))
    state = {"step": step, "trainer": learner.state_dict(), "world_size": ctx.world_size, "history": [],
             "rng": capture_rng_state(), "task_position": 0, "weight_version": step}  # fmt: skip
    save_sharded_checkpoint(folder / "checkpoints" / f"step_{step}", learner, tokenizer, state)


def train_to(learner: GRPOTrainer, ctx: DistContext, first: int, last: int) -> None:
    for step in range(first, last + 1):
        assert not learner.train_step(rows(ctx.rank, step)).step_skipped


def uninterrupted(out: Path, ctx: DistContext) -> None:
    for name, lora in (("full", False), ("lora", True)):
        folder = out / name
        learner = trainer(ctx, lora)
        train_to(learner, ctx, 1, 1)
        save(folder, ctx, learner, 1)
        weights = {n: unshard_tensor(p).clone() for n, p in learner.module.named_parameters()}
        moments = {n: unshard_tensor(learner.optimizer.state[p]["exp_avg"]).clone()
                   for n, p in learner.module.named_parameters() if p.requires_grad}  # fmt: skip
        digest = weights_digest(learner.module)
        if ctx.is_main:
            torch.save({"weights": weights, "exp_avg": moments, "digest": digest}, folder / "gathered_step_1.pt")
        train_to(learner, ctx, 2, STEPS)
        digest = weights_digest(learner.module)
        if ctx.is_main:
            (folder / "digest.txt").write_text(digest)


def killed(out: Path, ctx: DistContext) -> None:
    import torch.distributed.checkpoint as dcp

    folder = out / "full"
    learner = trainer(ctx, lora=False)
    train_to(learner, ctx, 1, 1)
    save(folder, ctx, learner, 1)
    train_to(learner, ctx, 2, 2)

    def hold(self, *args, **kwargs) -> None:  # this rank's shards are written, its metadata is not
        (out / f"saving_rank{ctx.rank}").write_text("")
        time.sleep(3600)

    dcp.FileSystemWriter.finish = hold
    save(folder, ctx, learner, 2)
    raise AssertionError("the save went on")


def resumed(out: Path, ctx: DistContext) -> None:
    from agentic_rl.loop.weight_sync import restore_weights

    for name, lora in (("full", False), ("lora", True)):
        root = out / name / "checkpoints"
        if not root.is_dir():
            continue
        if ctx.is_main:
            discard_partial(root)
        ctx.allreduce_max(0.0)  # a barrier: rank 0 removed what a killed save left
        start = latest_checkpoint(root, final_step=STEPS)
        learner = trainer(ctx, lora)
        restore_weights(learner, start.path, load_state(start))
        train_to(learner, ctx, start.step + 1, STEPS)
        digest = weights_digest(learner.module)
        if ctx.is_main:
            (out / name / "digest.txt").write_text(digest)


def main(mode: str, out: str) -> None:
    from agentic_rl.train.distributed import init_from_env

    torch.set_num_threads(1)
    ctx = init_from_env("cpu", timeout_s=120)
    {"uninterrupted": uninterrupted, "killed": killed, "resumed": resumed}[mode](Path(out), ctx)
    ctx.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
