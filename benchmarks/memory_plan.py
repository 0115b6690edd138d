"""The memory plan against what training takes on this CPU: SmolLM2-135M GRPO steps, one lever setting per process.

For each setting a fresh process (this script with `--worker`) loads SmolLM2-135M (real weights, fp32), builds the
trainer (`GRPOTrainer`) and takes `--steps` GRPO steps (AdamW) on `--rows` trajectories of `--prompt` + `--response`
tokens, micro-batch `--micro-batch`; it reports its peak RSS (`ru_maxrss`: model, AdamW state, gradients,
activations, logits, the interpreter and its libraries). The plan (`loop.memory_plan.plan_memory`, platform `cpu`,
one rank, the trainer alone: no engine in these processes) predicts the trainer's peak from the model's config.json;
on the CPU host and card memory are the same RAM, so the prediction is the trainer's card peak plus its host part.
The workers run with the allocator `agentic-rl train` preloads on this machine (tcmalloc, `cli.preload`); the
`fp32` setting also runs once with glibc's malloc, reported beside (glibc keeps much of what one micro-batch freed
out of the next one's reach: its peak is higher). Goal: |measured / planned - 1| <= 15% for every setting.

    .venv/bin/python benchmarks/memory_plan.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import Goal, one_turn_trajectory, peak_rss_bytes, save, table, verdict

HERE = Path(__file__).resolve()
GIB = 1 << 30
PAD = 2
#: name -> GRPOConfig fields of each setting
SETTINGS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp32 +ckpt": {"activation_checkpointing": True},
    "bf16": {"precision": "bf16"},
    "bf16 +ckpt": {"precision": "bf16", "activation_checkpointing": True},
    "fp32 +KL": {"kl_coef": 0.1},
    "lora r16": {"lora": {"rank": 16}},
    "fsdp +offload (1 rank)": {"sharding": "fsdp", "cpu_offload": True},
}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """`--steps` GRPO steps of SmolLM2-135M under one setting; the process's peak RSS and the step seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model
    from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("smollm2-135m-instruct")), dtype=torch.float32)
    config = GRPOConfig(lr=1e-6, micro_batch_size=args.micro_batch, **SETTINGS[args.worker])
    trainer = GRPOTrainer(model, pad_token_id=PAD, config=config)
    rows = [one_turn_trajectory(i, float(i % 2), args.prompt, args.response, 49152) for i in range(args.rows)]
    seconds = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        trainer.train_step(rows)
        seconds.append(time.perf_counter() - t0)
    close = getattr(trainer, "close", None)
    if close is not None:
        close()
    return {"peak_gib": peak_rss_bytes() / GIB, "step_seconds": seconds}


def planned(name: str, args: argparse.Namespace) -> dict[str, float]:
    """The plan's trainer for setting `name`, GiB: its peak (card + host: one RAM here) and the parts."""
    from agentic_rl.loop.memory_plan import ModelShape, plan_memory
    from agentic_rl.models import resolve_model
    from agentic_rl.train.grpo_config import GRPOConfig

    shape = ModelShape.load(resolve_model("smollm2-135m-instruct"))
    config = GRPOConfig(micro_batch_size=args.micro_batch, **SETTINGS[name])
    plan = plan_memory(shape, gpus=1, gpu_memory_gib=64.0, optimizer=config, max_prompt_length=args.prompt,
                       max_response_length=args.response, n_parallel_agents=1, max_model_len=args.prompt + args.response,
                       platform="cpu")  # fmt: skip
    t = plan.trainer
    parts = {**t.resident, **t.step, **t.backward}
    return {"planned_gib": t.peak_gib + t.host_gib, **{f"{k} (GiB)": v for k, v in parts.items()}, **{f"host {k} (GiB)": v for k, v in t.host.items()}}  # fmt: skip


def launch(name: str, args: argparse.Namespace, *, preload: bool = True) -> dict[str, Any]:
    """Run setting `name` in a fresh worker process, with `agentic-rl train`'s preloaded allocator unless told not."""
    from agentic_rl.cli.preload import find_libraries, preload_environment

    command = [sys.executable, str(HERE), "--worker", name, "--prompt", str(args.prompt), "--response",
               str(args.response), "--rows", str(args.rows), "--micro-batch", str(args.micro_batch), "--steps",
               str(args.steps)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    libraries = find_libraries() if preload else []
    env = (preload_environment(env, libraries) or env) if libraries else env
    proc = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 settings (fp32, bf16 +ckpt), 128 + 128 tokens")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="2 or more: AdamW's state exists from the first step on")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", choices=list(SETTINGS), default=None)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    from agentic_rl.cli.preload import find_libraries

    names = list(SETTINGS)
    if args.quick:
        args.prompt, args.response, names = 128, 128, ["fp32", "bf16 +ckpt"]
    results: dict[str, Any] = {key: getattr(args, key) for key in ("prompt", "response", "rows", "micro_batch", "steps")}
    runs = {}
    for name in names:
        runs[name] = {**planned(name, args), **launch(name, args)}
        runs[name]["ratio"] = runs[name]["peak_gib"] / runs[name]["planned_gib"]
        print(f"{name}: measured {runs[name]['peak_gib']:.2f} GiB, planned {runs[name]['planned_gib']:.2f} GiB", flush=True)
    results["settings"] = runs
    results["allocator"] = " ".join(find_libraries()) or "glibc"
    glibc = launch("fp32", args, preload=False)
    results["fp32_glibc_malloc"] = {**glibc, "ratio": glibc["peak_gib"] / runs["fp32"]["planned_gib"]}
    print(f"fp32 with glibc malloc: measured {glibc['peak_gib']:.2f} GiB ({results['fp32_glibc_malloc']['ratio']:.2f} x the plan)")
    print(table(["setting", "measured GiB", "planned GiB", "measured / planned", "step s"],
                [[n, r["peak_gib"], r["planned_gib"], r["ratio"], r["step_seconds"][-1]] for n, r in runs.items()]))  # fmt: skip
    worst = max(runs.values(), key=lambda r: abs(r["ratio"] - 1))
    goal = Goal("largest |measured / planned - 1| over the settings", abs(worst["ratio"] - 1), "<=", 0.15)
    save("memory_plan", results, args.out, args.quick, goal=verdict(goal))


if __name__ == "__main__":
    main()
