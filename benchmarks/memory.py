"""Memory: peak RSS of a 64-agent rollout, and RSS / open file descriptors over 1,000 trajectories.

One process builds the in-process vLLM engine and runs multi-turn trajectories (the calculator runs after every
turn, as in `engine_utilization.py`). Peak RSS is sampled every 10 ms by a background thread during the 64-agent
rollout and reported next to the RSS right after the engine started (model weights and KV cache included). The
soak then runs `--trajectories` more in batches at 64 concurrency on the tiny random model (the harness and the
engine's bookkeeping are what can leak, not the weights) and records RSS and open file descriptors after every
batch; growth is reported from the end of the second batch, and over the second half of the soak (glibc's
allocator keeps freed arena memory, so RSS rises in steps early on; `MALLOC_MMAP_THRESHOLD_=131072` in the
environment flattens those steps, at some speed cost). The goal "flat": at most `FLAT_MB` of RSS growth over the
second half, no open file descriptors gained, no trajectory lost.

    .venv/bin/python benchmarks/memory.py [--quick] [--trajectories N] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
from common import Goal, PeakSampler, open_fds, rss_bytes, save, table, verdict
from engine_utilization import DATA, CalculatorEveryTurn

from agentic_rl import ChatRenderer, HarnessConfig, run_tasks, run_trajectory
from agentic_rl.rollout.spec import RolloutSpec

MB = 1 << 20
FLAT_MB = 16.0  # "flat": the allocator's steps are ~10 MB; a 32 KB-per-trajectory leak over 500 trajectories is 16 MB
ENGINE_KWARGS: dict = {}


async def rollout(
    engine: Any, renderer: ChatRenderer, tasks: list[dict[str, Any]], agents: int, turns: int, max_tokens: int
) -> int:
    """Run `tasks` at `agents` concurrency; returns how many failed (every task is accounted for)."""
    config = HarnessConfig(max_steps=turns, max_response_length=2048, check_alignment=False,
                           sampling={"temperature": 1.0, "max_tokens": max_tokens, "seed": 0})  # fmt: skip
    env = CalculatorEveryTurn(turns)

    async def one(task: dict[str, Any], idx: int) -> Any:
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    trajectories = await run_tasks(tasks, one, n_parallel_agents=agents)
    assert len(trajectories) == len(tasks)
    return sum(t.failed for t in trajectories)


async def with_engine(model: str, fn: Any) -> Any:
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model

    path = resolve_model(model)
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(path)))
    engine = VLLMEngine(VLLMEngineConfig(model=path, max_model_len=4096, kv_cache_gib=1.0, engine_kwargs=ENGINE_KWARGS))
    await engine.start()
    try:
        return await fn(engine, renderer)
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--soak-model", default="tiny-random-smollm2")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n_soak = args.trajectories or (320 if args.quick else 1000)
    batch = 32 if args.quick else 100
    from agentic_rl.data import load_tasks

    pool = load_tasks(DATA, 1000)
    results: dict[str, Any] = {}

    async def peak(engine: Any, renderer: ChatRenderer) -> None:
        gc.collect()
        results["rss_after_engine_start_mb"] = rss_bytes() / MB
        with PeakSampler() as sampler:
            failed = await rollout(engine, renderer, pool[:64], 64, 2, 64)
        results["rollout_64_peak_rss_mb"] = sampler.peak / MB
        results["rollout_64_peak_over_start_mb"] = (sampler.peak - results["rss_after_engine_start_mb"] * MB) / MB
        results["rollout_64_failed"] = failed

    async def soak(engine: Any, renderer: ChatRenderer) -> None:
        samples = []
        t0 = time.perf_counter()
        for start in range(0, n_soak, batch):
            tasks = [pool[i % len(pool)] for i in range(start, min(start + batch, n_soak))]
            failed = await rollout(engine, renderer, tasks, 64, 2, 32)
            gc.collect()
            samples.append({"done": start + len(tasks), "failed": failed, "rss_mb": rss_bytes() / MB, "fds": open_fds(),
                            "elapsed_s": time.perf_counter() - t0})  # fmt: skip
        results["soak"] = samples

    options = {"backend_options": {"use_uvloop": True}}
    anyio.run(with_engine, args.model, peak, **options)
    anyio.run(with_engine, args.soak_model, soak, **options)
    soak_rows = results["soak"]
    warm, last = soak_rows[1], soak_rows[-1]
    half = soak_rows[len(soak_rows) // 2 - 1]
    results["soak_rss_growth_mb"] = last["rss_mb"] - warm["rss_mb"]
    results["soak_rss_growth_second_half_mb"] = last["rss_mb"] - half["rss_mb"]
    results["malloc_mmap_threshold"] = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    results["soak_fd_growth"] = last["fds"] - warm["fds"]
    results["soak_lost"] = n_soak - last["done"]
    print(f"64-agent rollout ({args.model}): RSS after engine start {results['rss_after_engine_start_mb']:.0f} MB, "
          f"peak {results['rollout_64_peak_rss_mb']:.0f} MB (+{results['rollout_64_peak_over_start_mb']:.0f} MB)")  # fmt: skip
    print(f"soak: {n_soak} trajectories at 64 concurrency ({args.soak_model})")
    print(table(["done", "failed", "RSS MB", "open fds", "elapsed s"],
                [(r["done"], r["failed"], r["rss_mb"], r["fds"], r["elapsed_s"]) for r in soak_rows]))  # fmt: skip
    print(f"growth from batch 2 to the end: RSS {results['soak_rss_growth_mb']:+.1f} MB; over the second half "
          f"({half['done']} -> {last['done']}): {results['soak_rss_growth_second_half_mb']:+.1f} MB; "
          f"fds {results['soak_fd_growth']:+d}; lost {results['soak_lost']}")  # fmt: skip
    goal = verdict(Goal("soak RSS growth over the second half", results["soak_rss_growth_second_half_mb"], "<=", FLAT_MB, " MB", 1),
                   Goal("open fds growth", results["soak_fd_growth"], "<=", 0, "", 0),
                   Goal("lost trajectories", results["soak_lost"], "<=", 0, "", 0))  # fmt: skip
    save("memory", results, args.out, args.quick, goal=goal)


if __name__ == "__main__":
    main()
