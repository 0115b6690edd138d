"""The trainer on one GPU, checked in one short run: sharded (FSDP2 on one rank) bf16 GRPO steps with the memory
levers off and on, each beside a plain forward/backward, the plan's prediction and a device copy of the same bytes.

Where no CUDA device is present it says so and measures nothing (exit status 0); `--device cpu --tiny` runs the
same code on a tiny model on the CPU (the script's own check). Nothing is downloaded: the model is built at random
from a config of SmolLM2-1.7B's shape (Llama: hidden 2048, 24 layers, 32 heads, MLP 8192, vocab 49,152, tied
embeddings: 1.71B parameters), so that SmolLM2's tokenizer (`smollm2-135m-instruct`, the registry's) fits it.

For each lever set (`bf16`, `bf16 + activation checkpointing`, `bf16 + checkpointing + CPU offload`):

- step seconds: the median of `--steps` `GRPOTrainer.train_step` calls after a first one, on `--rows` trajectories of
  `--prompt` + `--response` tokens (micro-batch = all rows), beside a plain forward/backward of the same rows (the
  model under `torch.autocast`, no trainer, no optimizer);
- peak device memory (`torch.cuda.max_memory_allocated`) beside the memory plan's trainer peak
  (`agentic_rl.loop.memory_plan.plan_memory` less its CUDA context constant, which the allocator does not count);
- a weight sync's read: `trainer.named_weights()` (each parameter gathered from its shard) copied into bf16 device
  buffers, as an engine's load copies it, beside one device copy of the same bytes. With vLLM installed (not
  needed), `--engine` also pushes them into a real in-process `VLLMEngine`, times `update_weights` and the engine's
  rollout rate at tensor parallelism 1; without it the engine part is skipped and the output says so.

    python benchmarks/gpu_trainer.py [--steps 3] [--rows 4] [--prompt 512] [--response 512] [--engine] [--out FILE]
    python benchmarks/gpu_trainer.py --device cpu --tiny      # the CPU check of the script itself

It runs in well under 5 minutes on an H100 (three lever sets of a few steps each); it never needs vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
from typing import Any

from common import one_turn_trajectory, save, table, verdict

GIB = 1 << 30
PAD = 2
SMOLLM2_17B = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 2048, "intermediate_size": 8192,
               "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32,
               "max_position_embeddings": 8192, "rope_theta": 130000.0, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": True}  # fmt: skip
TINY = {**SMOLLM2_17B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4}  # fmt: skip
LEVER_SETS = {
    "bf16": {},
    "bf16 + ckpt": {"activation_checkpointing": True},
    "bf16 + ckpt + offload": {"activation_checkpointing": True, "cpu_offload": True},
}


class Device:
    """The measured device: synchronize, reset and read the allocator's peak (CUDA), or no-ops on the CPU."""

    def __init__(self, kind: str) -> None:
        import torch

        self.kind, self.torch = kind, torch

    def sync(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return self.torch.cuda.max_memory_allocated() / GIB if self.kind == "cuda" else None

    def timed(self, fn: Any) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0


def new_model(shape: dict[str, Any], device: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**shape)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)


def plain_seconds(shape: dict[str, Any], rows: list[Any], dev: Device, steps: int) -> float:
    """Median seconds of a forward/backward of `rows` under bf16 autocast, no trainer (the first call warms up)."""
    import torch

    from agentic_rl.train.loss import response_logprobs
    from agentic_rl.train.packing import pack_trajectories

    model = new_model(shape, dev.kind).train()
    batch = pack_trajectories(rows, pad_token_id=PAD, device=dev.kind)

    def once() -> None:
        with torch.autocast(device_type=dev.kind, dtype=torch.bfloat16):
            logprobs = response_logprobs(model, batch, share_prefix=False, bucket=False)
        logprobs.sum().backward()
        model.zero_grad(set_to_none=True)

    times = [dev.timed(once) for _ in range(steps + 1)]
    return statistics.median(times[1:])


def planned_gib(shape: dict[str, Any], config: Any, args: argparse.Namespace) -> float:
    """The memory plan's trainer peak for this run, less the CUDA context (which `max_memory_allocated` leaves out)."""
    from agentic_rl.loop.memory_parts import PLATFORM_OVERHEAD_GIB
    from agentic_rl.loop.memory_plan import ModelShape, plan_memory

    plan = plan_memory(ModelShape.from_config(shape), gpus=1, gpu_memory_gib=args.gpu_memory_gib, optimizer=config,
                       max_prompt_length=args.prompt, max_response_length=args.response, n_parallel_agents=1,
                       max_model_len=args.prompt + args.response, platform="cuda")  # fmt: skip
    return plan.trainer.peak_gib - PLATFORM_OVERHEAD_GIB["cuda"]


def sync_seconds(trainer: Any, dev: Device) -> tuple[float, float, int]:
    """Seconds to read `named_weights()` into bf16 device buffers (an engine's load), seconds of one device copy of
    the same bytes, and the bytes."""
    import torch

    buffers = {name: torch.empty(t.shape, dtype=torch.bfloat16, device=dev.kind) for name, t in trainer.named_weights()}

    def read() -> None:
        for name, tensor in trainer.named_weights():
            buffers[name].copy_(tensor)

    seconds = min(dev.timed(read) for _ in range(3))
    size = sum(b.numel() * b.element_size() for b in buffers.values())
    src = torch.empty(size, dtype=torch.uint8, device=dev.kind)
    dst = torch.empty_like(src)
    memcpy = min(dev.timed(lambda: dst.copy_(src)) for _ in range(3))
    return seconds, memcpy, size


def engine_seconds(trainer: Any, shape: dict[str, Any], dev: Device) -> tuple[float, float]:
    """Seconds of a real `VLLMEngine.update_weights` from the trainer's shards (the model saved once, bf16, with
    SmolLM2's tokenizer, for the engine to start from), and the engine's rollout rate at tensor parallelism 1 after
    it: tokens per second sampling 32 prompts x 64 tokens at once, greedy, as `benchmarks/tensor_parallel.py` does
    on the CPU (one GPU: no TP 2 line)."""
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model

    async def push(folder: str) -> float:
        engine = VLLMEngine(VLLMEngineConfig(model=folder, dtype="bfloat16", max_model_len=2048, kv_cache_gib=1.0,
                                             gpu_memory_utilization=0.3))  # fmt: skip
        await engine.start()
        try:
            await engine.update_weights(trainer.named_weights())  # the first loads the engine's scratch
            t0 = time.perf_counter()
            await engine.update_weights(trainer.named_weights())
            sync = time.perf_counter() - t0
            prompts = [[100 + (7 * i + j) % 4000 for j in range(32)] for i in range(32)]
            sampling = {"temperature": 0.0, "max_tokens": 64, "min_tokens": 64}
            t0 = time.perf_counter()
            done = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
            return sync, sum(len(g.token_ids) for g in done) / (time.perf_counter() - t0)
        finally:
            await engine.close()

    with tempfile.TemporaryDirectory() as folder:
        new_model(shape, "cpu").to(dtype=__import__("torch").bfloat16).save_pretrained(folder)
        AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m-instruct"))).save_pretrained(folder)
        return asyncio.run(push(folder))


def run_levers(name: str, levers: dict[str, Any], shape: dict[str, Any], rows: list[Any], dev: Device,
               args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    from agentic_rl.train.distributed import DistContext
    from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

    config = GRPOConfig(lr=1e-6, sharding="fsdp", precision="bf16", micro_batch_size=len(rows), **levers)
    dev.reset_peak()
    trainer = GRPOTrainer(new_model(shape, dev.kind), pad_token_id=PAD, config=config, dist=DistContext.solo(dev.kind))
    times = [dev.timed(lambda: trainer.train_step(rows)) for _ in range(args.steps + 1)]
    result = {"levers": name, "step_seconds": statistics.median(times[1:]), "peak_gib": dev.peak_gib(),
              "planned_gib": planned_gib(shape, config, args)}  # fmt: skip
    result["sync_seconds"], result["memcpy_seconds"], result["sync_bytes"] = sync_seconds(trainer, dev)
    if args.engine and name == "bf16":
        result["engine_sync_seconds"], result["engine_tp1_tokens_per_s"] = engine_seconds(trainer, shape, dev)
    trainer.dist.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the same family (the script's check)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--gpu-memory-gib", type=float, default=80.0, help="the card the plan is asked about")
    parser.add_argument("--engine", action="store_true", help="also time a real vLLM engine's update_weights")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing measured (run this on a GPU machine, or --device cpu --tiny)")
        return
    if args.engine and importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: the engine part is skipped (the trainer-side sync is still measured)")
        args.engine = False
    shape = TINY if args.tiny else SMOLLM2_17B
    dev = Device(args.device)
    vocab = shape["vocab_size"]
    rows = [one_turn_trajectory(i, float(i % 2), args.prompt, args.response, vocab) for i in range(args.rows)]
    plain = plain_seconds(shape, rows, dev, args.steps)
    results = [run_levers(name, levers, shape, rows, dev, args) for name, levers in LEVER_SETS.items()]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{device_name}; {'tiny' if args.tiny else 'SmolLM2-1.7B-shaped'} model; {args.rows} rows of "
          f"{args.prompt} + {args.response} tokens; plain bf16 forward/backward {plain:.3f} s")  # fmt: skip
    print(table(["levers", "step s", "step / plain", "peak GiB", "planned GiB", "sync s", "memcpy s", "engine sync s"],
                [[r["levers"], r["step_seconds"], r["step_seconds"] / plain, r["peak_gib"] or "n/a", r["planned_gib"],
                  r["sync_seconds"], r["memcpy_seconds"], r.get("engine_sync_seconds", "n/a")]
                 for r in results]))  # fmt: skip
    if not args.engine:
        print("engine part: not run (--engine, with vLLM installed, adds it)")
    else:
        print(f"engine rollout at tensor parallelism 1: {results[0]['engine_tp1_tokens_per_s']:.0f} tokens/s")
    save("gpu_trainer", {"device": device_name, "tiny": args.tiny, "plain_seconds": plain, "runs": results}, args.out,
         quick=args.tiny, goal=verdict(note="measured on " + device_name))  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
