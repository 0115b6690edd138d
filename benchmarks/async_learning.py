"""Does bounded-staleness training learn as well as lockstep, sooner? `examples/train_arithmetic.yaml` with
`rollout.max_staleness` k = 1 against k = 0 (lockstep), the same seeds, run one after the other and interleaved
(k=0 seed 0, k=1 seed 0, k=0 seed 1, ...) so that both see the same machine.

For each run, `learning.read_run` reads the held-out curve; the time to gain is the time from the end of the
step-0 evaluation to the first evaluation whose held-out accuracy is up by `--min-gain` (training, syncs and later
evaluations included; engine start and a first-use model build, the same for both modes, left out). Goals, per
seed: k = 1 reaches the gain in at most `--max-time-ratio` (0.7) of lockstep's time, and its final held-out accuracy
is at most `--max-accuracy-gap` (0.05) below lockstep's.

    .venv/bin/python benchmarks/async_learning.py [--seeds 0 1] [--staleness 1] [--set KEY=VALUE ...] [--quick]
    .venv/bin/python benchmarks/async_learning.py --reuse benchmarks/results/async_learning.json   # goals again

`--quick` runs 4 steps on one seed (a smoke run: the gain is rarely reached that soon).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import Goal, save, table, verdict
from learning import ROOT, improved, run_seed


def time_to_gain(run: dict[str, Any], min_gain: float) -> float | None:
    """Seconds from the end of the step-0 evaluation to the first evaluation with the gain, or None."""
    start = run["curve"][0]["elapsed_s"]
    reached = [c["elapsed_s"] - start for c in run["curve"]
               if improved(run["heldout_accuracy_before"], c["heldout_accuracy"], min_gain) >= min_gain]  # fmt: skip
    return reached[0] if reached else None


def measure(args: argparse.Namespace, overrides: list[str]) -> dict[tuple[int, int], dict[str, Any]]:
    """Lockstep and k runs, interleaved per seed."""
    runs: dict[tuple[int, int], dict[str, Any]] = {}
    for seed in args.seeds:
        for k in (0, args.staleness):
            run = run_seed(args.config, seed, [*overrides, f"rollout.max_staleness={k}"], Path(args.runs_dir),
                           f"async_learning_k{k}")  # fmt: skip
            run["max_staleness"] = k
            runs[(seed, k)] = run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/train_arithmetic.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--staleness", type=int, default=1, help="k of the async runs (lockstep is k = 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    parser.add_argument("--min-gain", type=float, default=0.25)
    parser.add_argument("--max-time-ratio", type=float, default=0.7)
    parser.add_argument("--max-accuracy-gap", type=float, default=0.05)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reuse", default=None, metavar="JSON", help="the runs of an earlier result file: goals again")
    parser.add_argument("--note", default="", help="what the reader must know of the machine while it ran")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    overrides = list(args.set)
    if args.quick:
        args.seeds = args.seeds[:1]
        overrides += ["steps=4", "eval_every=2"]
    if args.reuse:
        saved = json.loads(Path(args.reuse).read_text())
        args.config, overrides, args.staleness = saved["config"], saved["overrides"], saved["staleness"]
        runs = {(r["seed"], r["max_staleness"]): r for r in saved["runs"]}
        args.seeds = sorted({seed for seed, _ in runs})
        args.note = args.note or saved.get("note", "")
    else:
        runs = measure(args, overrides)
    rows, goals = [], []
    for seed in args.seeds:
        lock, fast = runs[(seed, 0)], runs[(seed, args.staleness)]
        for r in (lock, fast):
            r["time_to_gain_s"] = time_to_gain(r, args.min_gain)
            r["train_s"] = r["curve"][-1]["elapsed_s"] - r["curve"][0]["elapsed_s"]
            rows.append([seed, r["max_staleness"], r["heldout_accuracy_before"], r["heldout_accuracy_after"],
                         r["time_to_gain_s"] if r["time_to_gain_s"] is not None else "never", r["train_s"],
                         r["wall_s"]])  # fmt: skip
        ratio = (fast["time_to_gain_s"] / lock["time_to_gain_s"]
                 if fast["time_to_gain_s"] is not None and lock["time_to_gain_s"] else float("inf"))  # fmt: skip
        shortfall = lock["heldout_accuracy_after"] - fast["heldout_accuracy_after"]
        goals += [Goal(f"seed {seed} time to +{args.min_gain:g} k={args.staleness}/k=0", ratio, "<=", args.max_time_ratio),
                  Goal(f"seed {seed} final held-out k=0 minus k={args.staleness}", shortfall, "<=",
                       args.max_accuracy_gap)]  # fmt: skip
    print(table(["seed", "k", "before", "after", "gain reached at s", "train s", "wall s"], rows))
    results = {"config": args.config, "overrides": overrides, "staleness": args.staleness, "note": args.note,
               "runs": [runs[key] for key in sorted(runs)]}  # fmt: skip
    save("async_learning", results, out=args.out, quick=args.quick, goal=verdict(*goals))


if __name__ == "__main__":
    main()
