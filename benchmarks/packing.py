"""Packing throughput: `pack_trajectories` vs a bare `torch.cat` of the same tensors, side by side in one run.

B trajectories of about 4k tokens each (prompt ~512, response ~3.5k, random lengths from a fixed seed) are packed
into the padded GRPO batch (ids, attention mask, position ids, response mask, old logprobs, rewards, groups). The
bound is one `torch.cat` per field of the same per-trajectory tensors: it moves the same bytes with no padding
layout. Both are timed as the median of `--repeats` runs; throughput is real (non-pad) tokens per second.

    .venv/bin/python benchmarks/packing.py [--quick] [--trajectories B] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from common import save, table, verdict

from agentic_rl.train.packing import pack_trajectories
from agentic_rl.types import Trajectory


def make_trajectories(n: int, seed: int = 0) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(384, 641, (1,), generator=gen))
        r = int(torch.randint(3328, 3585, (1,), generator=gen))
        mask = (torch.rand(r, generator=gen) < 0.8).long()
        out.append(Trajectory(
            prompt_tokens=torch.randint(3, 49152, (p,), generator=gen), response_tokens=torch.randint(3, 49152, (r,), generator=gen),
            response_masks=mask, idx=i, trajectory_reward=float(i % 2), response_logprobs=-torch.rand(r, generator=gen) * mask,
        ))  # fmt: skip
    return out


def bare_cat(trajectories: list[Trajectory]) -> tuple[torch.Tensor, ...]:
    ids = torch.cat([torch.cat((t.prompt_tokens, t.response_tokens)) for t in trajectories])
    masks = torch.cat([t.response_masks for t in trajectories]).to(torch.float32)
    logprobs = torch.cat([t.response_logprobs for t in trajectories])
    return ids, masks, logprobs


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n = args.trajectories or (256 if args.quick else 1024)
    repeats = args.repeats or (3 if args.quick else 5)
    trajectories = make_trajectories(n)
    tokens = sum(t.prompt_tokens.numel() + t.response_tokens.numel() for t in trajectories)
    groups = [i // 8 for i in range(n)]
    pack = lambda: pack_trajectories(trajectories, pad_token_id=2, group_ids=groups)  # noqa: E731
    pack(), bare_cat(trajectories)  # warm up allocator and kernels
    pack_s = median_time(pack, repeats)
    cat_s = median_time(lambda: bare_cat(trajectories), repeats)
    batch = pack()
    assert int(batch.attention_mask.sum()) == tokens
    rows = [("torch.cat (bound)", cat_s, tokens / cat_s / 1e6, 1.0), ("pack_trajectories", pack_s, tokens / pack_s / 1e6, cat_s / pack_s)]
    print(f"packing {n} trajectories, {tokens / 1e6:.2f} M tokens (~{tokens // n} per trajectory), {torch.get_num_threads()} threads")
    print(table(["method", "median s", "M tokens/s", "speed vs cat"], rows))
    save("packing", {"trajectories": n, "tokens": tokens, "pack_s": pack_s, "cat_s": cat_s,
                     "pack_tokens_per_s": tokens / pack_s, "cat_tokens_per_s": tokens / cat_s, "pack_over_cat": pack_s / cat_s}, args.out, args.quick,
         goal=verdict(note=f"{tokens / pack_s / 1e6:.1f} M tok/s, {pack_s / cat_s:.1f}x the time of torch.cat"))  # fmt: skip


if __name__ == "__main__":
    main()
