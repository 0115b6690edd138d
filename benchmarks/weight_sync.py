"""Weight-sync seconds next to the memcpy bound, measured side by side in one run.

For each engine dtype: the bytes pushed, the machine's measured copy bandwidth (a torch copy of the same number of
bytes), the bound bytes / bandwidth, and `VLLMEngine.update_weights` wall time (median of N), and which load path ran. Prints a table and writes JSON.

    .venv/bin/python benchmarks/weight_sync.py [--quick] [--model smollm2-135m-instruct] [--repeats 5]
        [--weight-sync in_place|reload] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio
import torch
from common import Goal, save, table, verdict


def memcpy_seconds(n_bytes: int, repeats: int) -> float:
    src = torch.empty(n_bytes, dtype=torch.uint8)
    src.fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm up: page in both buffers
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def sync_times(engine: Any, weights: list[tuple[str, torch.Tensor]], repeats: int) -> list[float]:
    """Seconds of each of `repeats` `update_weights` calls; closes the engine."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await engine.update_weights(weights)
        out.append(time.perf_counter() - t0)
    await engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bfloat16 only, 3 repeats")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--dtypes", default=None)
    parser.add_argument("--weight-sync", default="in_place", choices=["in_place", "reload"],
                        help="the engine's load path (reload: vLLM's reload_weights, the fallback)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.dtypes = args.dtypes or ("bfloat16" if args.quick else "bfloat16,float32")

    from transformers import AutoModelForCausalLM

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model

    model_dir = resolve_model(args.model)
    rows = []
    for dtype in args.dtypes.split(","):
        torch_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
        # Copies, as a trainer's parameters are: a model loaded in its checkpoint dtype (bf16 here) keeps its tensors
        # memory-mapped from the safetensors file, and reading those pages made each sync 15-30x slower.
        weights = [(n, p.detach().clone()) for n, p in model.named_parameters()]
        n_bytes = sum(p.numel() * p.element_size() for _, p in weights)
        engine = VLLMEngine(VLLMEngineConfig(model=model_dir, dtype=dtype, max_model_len=1024, kv_cache_gib=0.25,
                                             weight_sync=args.weight_sync))  # fmt: skip
        engine.start_sync()

        sync = statistics.median(anyio.run(sync_times, engine, weights, args.repeats))
        copy = memcpy_seconds(n_bytes, args.repeats)
        rows.append({"dtype": dtype, "bytes": n_bytes, "memcpy_s": copy, "memcpy_gb_per_s": n_bytes / copy / 1e9,
                     "sync_s": sync, "sync_over_memcpy": sync / copy, "path": engine.last_weight_sync})  # fmt: skip
        del model, weights

    print(f"weight sync of {args.model}, median of {args.repeats}")
    print(table(["dtype", "MB", "memcpy s", "GB/s", "sync s", "sync/memcpy"],
                [(r["dtype"], f"{r['bytes'] / 1e6:.1f}", r["memcpy_s"], f"{r['memcpy_gb_per_s']:.2f}", r["sync_s"],
                  f"{r['sync_over_memcpy']:.1f}") for r in rows]))  # fmt: skip
    for r in rows:
        print(f"{r['dtype']}: {r['path']}")
    goal = verdict(*(Goal(f"{r['dtype']} sync/memcpy", r["sync_over_memcpy"], "<=", 3.0, "x", 1) for r in rows))
    save("weight_sync", {"model": str(model_dir), "weight_sync": args.weight_sync, "rows": rows}, args.out, args.quick,
         goal=goal)  # fmt: skip


if __name__ == "__main__":
    main()
