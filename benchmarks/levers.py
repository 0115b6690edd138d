"""The trainer's memory levers on this CPU, side by side in one run: activation checkpointing and bf16 compute.

Each measurement runs in a fresh process (this script with `--worker`), so that one's heap does not carry into the
next; `OMP_NUM_THREADS` is left as the machine sets it.

- `activations`: a random-init model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads,
  MLP 4864, vocab 151,936, tied embeddings: 494M parameters, fp32, built from its config: no download) runs the
  trainer's forward (`train.loss.response_logprobs`, rows whole) and a backward of one `--prompt` + `--response`
  token row (default 1024 + 1024: a 2k-token row), with and without `activation_checkpointing`, in fp32 and bf16.
  Activation memory = the RSS after the forward - the RSS before it: what the forward keeps for the backward.
  Also reported: the forward's peak (its temporaries), and the backward's peak above the start less the gradients
  it allocated (4 bytes per parameter): the backward's own temporaries (at short rows, the tied 151,936 x 896
  embedding's gradient buffers dominate it). Goal: checkpointed / plain activations <= 0.3 (fp32).
- `training`: SmolLM2-135M (real weights) takes `--steps` GRPO steps (`GRPOTrainer.train_step`, AdamW) on 8
  trajectories of 256 + 256 tokens, micro-batch 4, each lever combination: peak RSS of the process (`ru_maxrss`)
  and the median step seconds (steps after the first). Reported, no goal: bf16 / fp32 peak and time.

    .venv/bin/python benchmarks/levers.py [--part activations|training|all] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import Goal, PeakSampler, one_turn_trajectory, peak_rss_bytes, rss_bytes, save, table, verdict

HERE = Path(__file__).resolve()
MB = 1 << 20
PAD = 2
QWEN2_05B = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}  # fmt: skip
LEVERS = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)]


def activations_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Forward + backward of one row on the ~0.5B model under one lever setting; the memory it took."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentic_rl.train.levers import autocast, enable_activation_checkpointing
    from agentic_rl.train.loss import response_logprobs
    from agentic_rl.train.packing import pack_trajectories

    torch.manual_seed(0)
    config = AutoConfig.for_model(**QWEN2_05B)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()
    if args.checkpointing:
        enable_activation_checkpointing(model)
    params = sum(p.numel() for p in model.parameters())
    batch = pack_trajectories([one_turn_trajectory(0, 1.0, args.prompt, args.response, QWEN2_05B["vocab_size"])],
                              pad_token_id=PAD)  # fmt: skip
    before = rss_bytes()
    t0 = time.perf_counter()
    with PeakSampler(0.005) as forward, autocast(args.precision, torch.device("cpu")):
        logprobs = response_logprobs(model, batch, share_prefix=False, bucket=False)
    held = rss_bytes()  # what the forward keeps for the backward: the activations (and the logprobs)
    with PeakSampler(0.005) as backward:
        logprobs.sum().backward()
    seconds = time.perf_counter() - t0
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    return {"parameters": params, "before_mb": before / MB, "activations_mb": (held - before) / MB,
            "forward_peak_mb": (forward.peak - before) / MB, "grads_mb": grads / MB,
            "backward_peak_mb": (backward.peak - before - grads) / MB, "seconds": seconds}  # fmt: skip


def training_worker(args: argparse.Namespace) -> dict[str, Any]:
    """`--steps` GRPO steps of SmolLM2-135M under one lever setting: peak RSS and step seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model
    from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("smollm2-135m-instruct")), dtype=torch.float32)
    config = GRPOConfig(lr=1e-6, micro_batch_size=4, precision=args.precision,
                        activation_checkpointing=args.checkpointing)  # fmt: skip
    trainer = GRPOTrainer(model, pad_token_id=PAD, config=config)
    rows = [one_turn_trajectory(i, float(i % 2), 256, 256, 49152) for i in range(8)]
    seconds, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(trainer.train_step(rows).as_metrics()["loss"])
        seconds.append(time.perf_counter() - t0)
    return {"peak_mb": peak_rss_bytes() / MB, "step_seconds": statistics.median(seconds[1:] or seconds),
            "losses": losses}  # fmt: skip


def launch(part: str, precision: str, checkpointing: bool, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, str(HERE), "--worker", part, "--precision", precision, "--prompt", str(args.prompt),
               "--response", str(args.response), "--steps", str(args.steps)]  # fmt: skip
    if checkpointing:
        command.append("--checkpointing")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"{part} {precision} checkpointing={checkpointing} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("activations", "training", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="a 256 + 256 token row, 2 steps")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", choices=("activations", "training"), default=None)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker = activations_worker if args.worker == "activations" else training_worker
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.prompt, args.response, args.steps = 256, 256, 2
    results: dict[str, Any] = {"prompt": args.prompt, "response": args.response, "steps": args.steps}
    goals = []
    for part in ("activations", "training") if args.part == "all" else (args.part,):
        runs = {f"{p}{' +ckpt' if c else ''}": launch(part, p, c, args) for p, c in LEVERS}
        results[part] = runs
        if part == "activations":
            print(table(["levers", "activations MB", "forward peak MB", "backward peak MB", "fwd+bwd s"],
                        [[k, r["activations_mb"], r["forward_peak_mb"], r["backward_peak_mb"], r["seconds"]]
                         for k, r in runs.items()]))  # fmt: skip
            ratio = runs["fp32 +ckpt"]["activations_mb"] / runs["fp32"]["activations_mb"]
            results["checkpointing_activation_ratio_fp32"] = ratio
            results["checkpointing_activation_ratio_bf16"] = runs["bf16 +ckpt"]["activations_mb"] / runs["bf16"]["activations_mb"]
            results["bf16_activation_ratio"] = runs["bf16"]["activations_mb"] / runs["fp32"]["activations_mb"]
            goals.append(Goal(f"activations checkpointed / plain at {args.prompt}+{args.response} tokens (fp32)",
                              ratio, "<=", 0.3, "x"))  # fmt: skip
        else:
            print(table(["levers", "peak MB", "step s"],
                        [[k, r["peak_mb"], r["step_seconds"]] for k, r in runs.items()]))  # fmt: skip
            results["bf16_peak_ratio"] = runs["bf16"]["peak_mb"] / runs["fp32"]["peak_mb"]
            results["bf16_time_ratio"] = runs["bf16"]["step_seconds"] / runs["fp32"]["step_seconds"]
            results["checkpointing_time_ratio"] = runs["fp32 +ckpt"]["step_seconds"] / runs["fp32"]["step_seconds"]
    note = ", ".join(f"{k} {v:.3f}" for k, v in results.items() if k.endswith("ratio"))
    save("levers", results, args.out, args.quick, goal=verdict(*goals, note=note))


if __name__ == "__main__":
    main()
