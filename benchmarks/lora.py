"""LoRA against full fine-tuning: the trainer's peak memory, optimizer state and weight-sync payload, side by side.

Each mode runs in its own child process (peak RSS only grows, so one process per mode): it builds a `GRPOTrainer` on
the same fp32 model (SmolLM2-135M-Instruct; the tiny random model with `--quick`), takes `--steps` GRPO steps on the
same fixed batch of real-text trajectories (groups of 4 with rewards 1/0, logprobs from the model itself), and
reports the process's peak RSS (and peak CUDA memory on a GPU), the bytes of the optimizer state (AdamW: two moments
per trained parameter), the trained parameters, the bytes one weight sync sends (every weight, or the adapter's
`adapter_model.safetensors`) and the mean step time after the first. The report is the LoRA / full ratio of each.

    .venv/bin/python benchmarks/lora.py [--quick] [--rank 16] [--steps 3] [--device cpu] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import peak_rss_bytes, save, table, verdict

MB = 1 << 20


def _trajectories(tokenizer: Any, model: Any, rows: int, device: str) -> list[Any]:
    """`rows` real-text answers in groups of 4 (rewards 1, 0, 1, 0), each with the logprobs `model` gives it."""
    import torch

    from agentic_rl.train.loss import response_logprobs
    from agentic_rl.train.packing import pack_trajectories
    from agentic_rl.types import StepTrajectory

    out = []
    for i in range(rows):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"Question {i // 4}: how many apples?"}],
                                               add_generation_prompt=True, tokenize=False)  # fmt: skip
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer = tokenizer.encode(f"Let me count: there are {13 * i + 7} apples in the basket.<|im_end|>",
                                  add_special_tokens=False)  # fmt: skip
        out.append(StepTrajectory(prompt_tokens=prompt_ids, response_tokens=answer, response_masks=[1] * len(answer),
                                  trajectory_reward=float(i % 2 == 0), idx=i % 4, task={"id": i // 4}))  # fmt: skip
    with torch.no_grad():
        logprobs = response_logprobs(model, pack_trajectories(out, pad_token_id=tokenizer.pad_token_id, device=device))
    return [StepTrajectory(prompt_tokens=t.prompt_tokens, response_tokens=t.response_tokens,
                           response_masks=t.response_masks, response_logprobs=row[: len(t.response_tokens)].tolist(),
                           trajectory_reward=t.trajectory_reward, idx=t.idx, task=t.task)
            for row, t in zip(logprobs.cpu(), out, strict=True)]  # fmt: skip


def measure(mode: str, model_name: str, rank: int, steps: int, rows: int, device: str) -> dict[str, Any]:
    """One mode's figures (run in a child process of its own)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.models import resolve_model
    from agentic_rl.train.lora import LoRAConfig
    from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

    model_dir = resolve_model(model_name)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    batch = _trajectories(tokenizer, model, rows, device)
    lora = LoRAConfig(rank=rank, alpha=2.0 * rank) if mode == "lora" else None
    config = GRPOConfig(lr=1e-5, micro_batch_size=4, lora=lora)
    trainer = GRPOTrainer(model, pad_token_id=tokenizer.pad_token_id, config=config)
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.train_step(batch)
        seconds.append(time.perf_counter() - t0)
    state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    trained = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    with tempfile.TemporaryDirectory() as tmp:
        if lora is not None:
            sync_bytes = (trainer.save_adapter(Path(tmp) / "adapter") / "adapter_model.safetensors").stat().st_size
        else:
            sync_bytes = sum(t.numel() * t.element_size() for _, t in trainer.named_weights())
    return {
        "peak_rss_mb": peak_rss_bytes() / MB,
        "peak_cuda_mb": torch.cuda.max_memory_allocated() / MB if device.startswith("cuda") else None,
        "optimizer_state_mb": sum(t.numel() * t.element_size() for t in state) / MB,
        "trained_params": sum(p.numel() for p in trained),
        "sync_mb": sync_bytes / MB,
        "step_s": sum(seconds[1:]) / max(len(seconds) - 1, 1),
    }


def _child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", mode, "--model", args.model, "--rank", str(args.rank),
               "--steps", str(args.steps), "--rows", str(args.rows), "--device", args.device]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny random model, 2 steps")
    p.add_argument("--model", default=None, help="default: smollm2-135m-instruct (tiny-random-smollm2 with --quick)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=None, help="default: 3 (2 with --quick)")
    p.add_argument("--rows", type=int, default=8, help="trajectories per step (groups of 4)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", choices=["full", "lora"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.model = args.model or ("tiny-random-smollm2" if args.quick else "smollm2-135m-instruct")
    args.steps = args.steps or (2 if args.quick else 3)
    if args.child:
        print(json.dumps(measure(args.child, args.model, args.rank, args.steps, args.rows, args.device)))
        return
    results = {mode: _child(mode, args) for mode in ("full", "lora")}
    keys = ["peak_rss_mb", "peak_cuda_mb", "optimizer_state_mb", "trained_params", "sync_mb", "step_s"]
    rows = []
    for key in keys:
        full, lora = results["full"][key], results["lora"][key]
        if full is not None:
            rows.append([key, full, lora, lora / full if full else float("nan")])
    print(f"{args.model}, rank {args.rank}, {args.steps} steps of {args.rows} trajectories on {args.device}")
    print(table(["figure", "full", "lora", "lora/full"], rows))
    ratios = {key: row[3] for key, row in zip([r[0] for r in rows], rows, strict=True)}
    note = (f"LoRA rank {args.rank} / full fine-tuning: optimizer state x{ratios['optimizer_state_mb']:.4f}, "
            f"peak RSS x{ratios['peak_rss_mb']:.3f}, sync payload x{ratios['sync_mb']:.4f}")  # fmt: skip
    figures = {"model": args.model, "rank": args.rank, "steps": args.steps, "rows": args.rows, "device": args.device}
    save("lora", {**figures, **results, "ratios": ratios}, args.out, args.quick, verdict(note=note))


if __name__ == "__main__":
    main()
