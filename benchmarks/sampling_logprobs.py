"""Cost of logprobs under a truncated sampling distribution (`sampling_logprobs`) vs the plain softmax's.

One (1, T, V) float32 set of logits (T = 256 positions, V = 49,152, SmolLM2's vocabulary), random from a fixed seed
and scaled like a language model's (standard deviation 3), with random targets. Each distribution is timed as the
median of `--repeats` runs, forward alone and forward + backward (the gradient of the logprobs' sum), against
`token_logprobs` (the plain path, which `sampling_logprobs` is for a plain distribution).

    .venv/bin/python benchmarks/sampling_logprobs.py [--quick] [--positions T] [--out FILE]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from common import save, table, verdict
from packing import median_time

from agentic_rl.train.logprobs import SamplingDistribution, sampling_logprobs, token_logprobs

VOCAB = 49152

CASES = {
    "plain (token_logprobs)": None,
    "temperature 0.7": SamplingDistribution(temperature=0.7),
    "top_k 20": SamplingDistribution(top_k=20),
    "top_p 0.8": SamplingDistribution(top_p=0.8),
    "temperature 0.7, top_k 20, top_p 0.8": SamplingDistribution(temperature=0.7, top_k=20, top_p=0.8),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(1, args.positions, VOCAB, generator=gen) * 3).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (1, args.positions), generator=gen)

    def forward(d: SamplingDistribution | None) -> Callable[[], Any]:
        def run() -> None:
            with torch.no_grad():
                token_logprobs(logits, targets) if d is None else sampling_logprobs(logits, targets, d)

        return run

    def backward(d: SamplingDistribution | None) -> Callable[[], Any]:
        def run() -> None:
            logits.grad = None
            (token_logprobs(logits, targets) if d is None else sampling_logprobs(logits, targets, d)).sum().backward()

        return run

    for d in CASES.values():  # warm up allocator and kernels
        forward(d)(), backward(d)()
    results = {name: {"forward_s": median_time(forward(d), repeats), "forward_backward_s": median_time(backward(d), repeats)}
               for name, d in CASES.items()}  # fmt: skip
    plain = results["plain (token_logprobs)"]
    rows = [(name, r["forward_s"] * 1e3, r["forward_s"] / plain["forward_s"], r["forward_backward_s"] * 1e3,
             r["forward_backward_s"] / plain["forward_backward_s"]) for name, r in results.items()]  # fmt: skip
    print(f"({args.positions}, {VOCAB}) float32 logits, {torch.get_num_threads()} threads, median of {repeats}")
    print(table(["distribution", "forward ms", "x plain", "fwd+bwd ms", "x plain"], rows))
    worst = max(r["forward_backward_s"] / plain["forward_backward_s"] for r in results.values())
    save("sampling_logprobs", {"positions": args.positions, "vocab": VOCAB, "results": results}, args.out, args.quick,
         goal=verdict(note=f"at most {worst:.1f}x the plain path's forward + backward"))  # fmt: skip


if __name__ == "__main__":
    main()
