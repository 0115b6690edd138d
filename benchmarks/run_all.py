"""Run every benchmark, each in its own process (so memory readings and engines do not mix), and print a summary.

    .venv/bin/python benchmarks/run_all.py [--quick] [--only NAME,...] [--with-peer]

`--quick` finishes in a few minutes on a 2-core CPU machine; without it the full sizes of each benchmark run
(engine utilization at 64 agents, packing 1024 x 4k tokens, 1,000-trajectory soak: tens of minutes). Each
benchmark ends with a goal line (GOAL MET, GOAL NOT MET or NO GOAL); the summary shows it per benchmark. The peer
comparison needs its own environment (`benchmarks/setup_peer.sh`) and runs only with `--with-peer`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import result_path, table

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["harness_overhead", "async_vs_lockstep", "packing", "weight_sync", "engine_utilization", "memory",
              "async_training"]


def headline(name: str, result: dict) -> str:
    """The one number each benchmark is about, in words."""
    if name == "harness_overhead":
        at64 = next(r for r in result["overhead"] if r["agents"] == 64)
        return f"ideal/measured at 64 agents {at64['ratio']:.3f}; per-turn cost 128/8 turns {result['turn_scaling']['ratio_128_over_8']:.2f}x"
    if name == "async_vs_lockstep":
        return ", ".join(f"{r['spread']} tail {r['agents']} agents {r['speedup']:.2f}x" for r in result["rows"] if r["agents"] == 64)
    if name == "packing":
        return f"{result['pack_tokens_per_s'] / 1e6:.1f} M tok/s, {result['pack_over_cat']:.1f}x the time of torch.cat"
    if name == "weight_sync":
        return ", ".join(f"{r['dtype']} {r['sync_s']:.3f} s = {r['sync_over_memcpy']:.1f}x memcpy" for r in result["rows"])
    if name == "engine_utilization":
        spread = f" (min {result['utilization_min']:.3f}, max {result['utilization_max']:.3f})" if "utilization_min" in result else ""
        return f"rollout / vLLM offline throughput, median {result['utilization']:.3f}{spread}"
    if name == "memory":
        return (f"64-agent peak +{result['rollout_64_peak_over_start_mb']:.0f} MB over the engine; soak growth "
                f"{result['soak_rss_growth_mb']:+.1f} MB, fds {result['soak_fd_growth']:+d}, lost {result['soak_lost']}")  # fmt: skip
    if name == "async_training":
        return ", ".join(f"{c['part']} {c['tools']} tools k={c['k']} {c['ratio']:.2f}x (bound {c['bound']:.2f}x)"
                         for c in result["part_a"] + result["part_b"]
                         if c["tools"] == "slow" and c["k"] and c["placement"] == "overlap")
    if name == "peer_verifiers":
        return f"ours / verifiers tokens/s {result.get('ratio_tokens_per_s', float('nan')):.2f}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--with-peer", action="store_true")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or BENCHMARKS + (["peer_verifiers"] if args.with_peer else [])
    rows = []
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call([sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if args.quick else [])])
        elapsed = time.perf_counter() - t0
        path = result_path(name, args.quick)
        result = json.loads(path.read_text()) if code == 0 and path.exists() else None
        summary = headline(name, result) if result else f"FAILED (exit {code})"
        goal = result.get("goal", "-").split(":")[0] if result else "-"
        rows.append((name, f"{elapsed:.0f}", goal, summary))
    print(table(["benchmark", "wall s", "goal", "result"], rows))


if __name__ == "__main__":
    main()
