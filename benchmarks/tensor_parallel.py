"""Rollout throughput of one engine at tensor parallelism 2 (two gloo ranks, `engine.tensor_parallel`) against
tensor parallelism 1 (one process), on the same model, prompts and tokens.

Each run samples P prompts of 32 random token ids, greedy, exactly N tokens each (`min_tokens = max_tokens`), all
in flight at once, after one warm-up request; the figure is sampled tokens per second of wall time on the leader.
On a CPU of few cores the two ranks share the cores the one process had: no goal, reported side by side.

    .venv/bin/python benchmarks/tensor_parallel.py [--model random-qwen2.5-0.5b|tiny-random-smollm2] [--prompts 32]
        [--tokens 64] [--out FILE]
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

from common import free_port_pair, save, table

HERE = Path(__file__).resolve().parent


async def rank_main(model: str, prompts: int, tokens: int, size: int, out: Path) -> None:
    """One rank of the measured engine: the leader samples and writes `out`; a follower serves its shard."""
    import anyio
    import torch

    from agentic_rl.engine.tensor_parallel import EngineGroup
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.train.distributed import init_from_env

    dist = init_from_env("cpu")
    group = EngineGroup.of(size, rank=dist.rank, world_size=dist.world_size, store=dist.store) if size > 1 else None
    engine = VLLMEngine(VLLMEngineConfig(model=model, dtype="float32", max_model_len=512, kv_cache_gib=0.5), group)
    await engine.start()
    if group is None or group.is_leader:
        g = torch.Generator().manual_seed(0)
        batch = [torch.randint(100, 40000, (32,), generator=g).tolist() for _ in range(prompts)]
        sampling = {"temperature": 0.0, "max_tokens": tokens, "min_tokens": tokens}
        await engine.generate(batch[0], {"temperature": 0.0, "max_tokens": 4})  # warm-up
        sampled = []
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for prompt in batch:

                async def one(prompt: list[int] = prompt) -> None:
                    sampled.append(len((await engine.generate(prompt, sampling)).token_ids))

                tg.start_soon(one)
        seconds = time.perf_counter() - t0
        out.write_text(json.dumps({"tokens": sum(sampled), "seconds": seconds}))
    await engine.close()
    dist.close()


def launch(model: str, prompts: int, tokens: int, size: int, folder: Path) -> dict[str, float]:
    """Run the measured engine on `size` ranks (subprocesses) and read what its leader wrote."""
    out = folder / f"tp{size}.json"
    port = free_port_pair()
    procs = []
    for rank in range(size):
        env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}"}
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        if size > 1:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        else:
            env.pop("WORLD_SIZE", None)
        args = [sys.executable, __file__, "--rank-of", str(size), "--model", model, "--prompts", str(prompts),
                "--tokens", str(tokens), "--result", str(out)]  # fmt: skip
        procs.append(subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(f"a rank of the TP={size} engine failed: {err[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random-qwen2.5-0.5b")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    parser.add_argument("--rank-of", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of is not None:
        import anyio

        anyio.run(rank_main, args.model, args.prompts, args.tokens, args.rank_of, Path(args.result))
        return
    from agentic_rl.models import resolve_model

    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "random-qwen2.5-0.5b":
            from lora_sync import random_qwen05b

            model = str(random_qwen05b(Path(tmp) / "model"))
        else:
            model = str(resolve_model(args.model))
        runs = {f"tp{size}": launch(model, args.prompts, args.tokens, size, Path(tmp)) for size in (1, 2)}
    rows = [[name, r["tokens"], f"{r['seconds']:.2f}", f"{r['tokens'] / r['seconds']:.0f}"] for name, r in runs.items()]
    print(table(["engine", "tokens", "seconds", "tokens/s"], rows))
    ratio = (runs["tp2"]["tokens"] / runs["tp2"]["seconds"]) / (runs["tp1"]["tokens"] / runs["tp1"]["seconds"])
    print(f"TP=2 / TP=1 throughput: {ratio:.2f}x on {os.cpu_count()} cores")
    save("tensor_parallel", {"model": args.model, "prompts": args.prompts, "tokens": args.tokens, "runs": runs,
                             "tp2_over_tp1": ratio, "cpu_count": os.cpu_count()}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
