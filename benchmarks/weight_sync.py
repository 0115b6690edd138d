"""Weight-sync seconds next to the memcpy bound, measured side by side in one run.

For each engine dtype: the bytes pushed, the machine's measured copy bandwidth (a torch copy of the same number of
bytes), the bound bytes / bandwidth, and `VLLMEngine.update_weights` wall time (median of N). Prints a table and
writes JSON.

    .venv/bin/python benchmarks/weight_sync.py [--model smollm2-135m-instruct] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio
import torch


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--out", default="benchmarks/results/weight_sync.json")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model

    model_dir = resolve_model(args.model)
    rows = []
    for dtype in args.dtypes.split(","):
        torch_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
        weights = [(n, p.detach()) for n, p in model.named_parameters()]
        n_bytes = sum(p.numel() * p.element_size() for _, p in weights)
        engine = VLLMEngine(VLLMEngineConfig(model=model_dir, dtype=dtype, max_model_len=1024, kv_cache_gib=0.25))
        engine.start_sync()

        async def sync_times() -> list[float]:
            out = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                await engine.update_weights(weights)
                out.append(time.perf_counter() - t0)
            await engine.close()
            return out

        sync = statistics.median(anyio.run(sync_times))
        copy = memcpy_seconds(n_bytes, args.repeats)
        rows.append({"dtype": dtype, "bytes": n_bytes, "memcpy_s": copy, "memcpy_gb_per_s": n_bytes / copy / 1e9,
                     "sync_s": sync, "sync_over_memcpy": sync / copy})  # fmt: skip
        del model, weights

    print(f"{'dtype':<10}{'MB':>9}{'memcpy s':>11}{'GB/s':>8}{'sync s':>9}{'sync/memcpy':>13}")
    for r in rows:
        print(f"{r['dtype']:<10}{r['bytes'] / 1e6:>9.1f}{r['memcpy_s']:>11.4f}{r['memcpy_gb_per_s']:>8.2f}"
              f"{r['sync_s']:>9.3f}{r['sync_over_memcpy']:>13.1f}")
    from pathlib import Path

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": str(model_dir), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
