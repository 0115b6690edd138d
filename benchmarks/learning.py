"""Does GRPO make the policy better? Held-out accuracy before and after a training run, for several seeds.

Runs `agentic-rl train` (a subprocess per seed) on a config that evaluates a fixed held-out set greedily before the
first step and at the end (`eval_data`), reads `heldout_accuracy` (or `--metric`, e.g. `heldout_hotpotqa_f1`) at
step 0 and at the last step from `metrics.jsonl`, copies each run's `metrics.png` next to the results and writes
`learning.json`. Goal per run: the metric up by at least `--min-gain` (absolute), or, if it starts above 0.5, its
error rate at least halved, at an evaluation within `--max-wall-s` seconds of the run's start (`time_to_gain_s`;
`wall_s` is the whole run).

    .venv/bin/python benchmarks/learning.py [--config examples/train_arithmetic.yaml] [--seeds 0 1]
        [--set KEY=VALUE ...] [--metric heldout_accuracy] [--min-gain 0.25] [--max-wall-s 1800] [--name learning]
        [--out FILE] [--read-only] [--nproc N]

`--nproc N` launches each run under torchrun with N ranks on this machine (e.g. `--nproc 2 --set
optimizer.sharding=fsdp --set rollout.tasks_per_step=4`: the same 8 tasks a step as one process, sharded).

`--name` names the run folders (`runs/NAME-seedS`), the plots and the results file (`benchmarks/results/NAME.json`),
so that another config's runs (e.g. `--config examples/train_gsm8k.yaml --name learning_gsm8k`) keep the arithmetic
results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS, Goal, free_port_pair, save, table, verdict

ROOT = Path(__file__).resolve().parent.parent


def run_dir(runs_dir: Path, name: str, seed: int) -> Path:
    """The folder of one seed's training run."""
    return runs_dir / f"{name}-seed{seed}"


def run_seed(
    config: str, seed: int, overrides: list[str], runs_dir: Path, name: str, metric: str = "heldout_accuracy",
    nproc: int = 1,
) -> dict[str, Any]:
    """Train with `seed` (under torchrun with `nproc` ranks when above 1), then `read_run`."""
    out = run_dir(runs_dir, name, seed)
    if out.exists():
        shutil.rmtree(out)
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port_pair()}"]
    command = [*launcher, "-m", "agentic_rl.cli", "train", "--config", config, "--set", f"seed={seed}",
               "--set", f"output_dir={out}", *[a for o in overrides for a in ("--set", o)]]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True)
    wall = time.perf_counter() - t0
    return read_run(out, seed, name, wall, metric)


def read_run(
    out: Path, seed: int, name: str, wall: float | None = None, metric: str = "heldout_accuracy"
) -> dict[str, Any]:
    """The held-out `metric` before/after (`{metric}_before`, `{metric}_after`), steps, wall seconds, the curve and
    the run folder of a finished run.

    Each evaluation's `elapsed_s` is the time from the run's start (its `config.json`, written before the engine
    starts) to its records' write (`rollouts/eval_step_N.jsonl`); `wall` (the whole subprocess) defaults to the last
    evaluation's `elapsed_s`.
    """
    start = (out / "config.json").stat().st_mtime
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if metric in r]
    if len(evals) < 2:
        raise SystemExit(f"{out}/metrics.jsonl holds {len(evals)} held-out evaluations; the config needs eval_data")
    curve = [{"step": r["step"], metric: r[metric], "heldout_accuracy": r.get("heldout_accuracy"),
              "heldout_tool_call_rate": r.get("heldout_tool_call_rate"), "heldout_mean_turns": r.get("heldout_mean_turns"),
              "elapsed_s": round((out / "rollouts" / f"eval_step_{r['step']}.jsonl").stat().st_mtime - start, 1)}
             for r in evals]  # fmt: skip
    wall = wall if wall is not None else curve[-1]["elapsed_s"]
    plot = RESULTS / f"{name}_seed{seed}.png"
    if (out / "metrics.png").is_file():
        shutil.copyfile(out / "metrics.png", plot)
    return {
        "seed": seed, f"{metric}_before": evals[0][metric], f"{metric}_after": evals[-1][metric],
        "steps": max(r["step"] for r in rows),
        "wall_s": round(wall, 1), "curve": curve, "train_reward_mean": [r.get("reward_mean") for r in rows if r["step"]],
        "plot": str(plot.relative_to(ROOT)) if plot.is_file() else None, "run_dir": str(out),
        "process_metrics_heldout": process_metrics(out),
    }  # fmt: skip


def process_metrics(out: Path) -> dict[str, dict[str, float]] | None:
    """What each held-out evaluation of an arithmetic run did, by step: the share of trajectories whose tool results
    show an intermediate value (`intermediate`) and the answer (`answer_computed`), each from a call that did not
    write it itself (`milestone_reward`'s rule, with the turn's `action_text` as the harness passes it), that give
    a final answer at all (`answered`, `final_answer_text`), and that answer right (`right`: answer reward 1). None when `eval_data` is not an `arithmetic:` spec."""
    from agentic_rl.parser import action_text
    from agentic_rl.rewards import final_answer_text
    from agentic_rl.rewards.turns import milestone_reward
    from agentic_rl.synthetic import parse_arithmetic_spec

    tasks = parse_arithmetic_spec(json.loads((out / "config.json").read_text()).get("eval_data") or "")
    if tasks is None:
        return None
    by_id = {t["id"]: t for t in tasks}
    metrics = {}
    for path in sorted((out / "rollouts").glob("eval_step_*.jsonl"), key=lambda p: int(p.stem.rsplit("_", 1)[1])):
        counts = {"intermediate": 0, "answer_computed": 0, "answered": 0, "right": 0}
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for record in records:
            task, chat = by_id[record["task_id"]], record["chat_completions"]
            shown = {"intermediate": set(), "answer_computed": set()}
            for k, message in enumerate(chat):
                if message["role"] != "assistant":
                    continue
                results = [m.get("content") or "" for m in chat[k + 1 :][: _tool_run(chat[k + 1 :])]]
                for key, milestones in (("intermediate", task["milestones"]), ("answer_computed", [task["ground_truth"]])):
                    milestone_reward(milestones, shown[key], results, 1.0, action=action_text(message.get("content") or ""))
            counts["intermediate"] += bool(shown["intermediate"])
            counts["answer_computed"] += bool(shown["answer_computed"])
            counts["answered"] += bool(final_answer_text(chat))
            counts["right"] += record["metrics"].get("res_reward", 0.0) >= 1.0
        metrics[path.stem.rsplit("_", 1)[1]] = {k: round(v / max(len(records), 1), 3) for k, v in counts.items()}
    return metrics


def _tool_run(messages: list[dict[str, Any]]) -> int:
    """How many messages at the start of `messages` are tool results."""
    return next((i for i, m in enumerate(messages) if m["role"] != "tool"), len(messages))


def improved(before: float, after: float, min_gain: float) -> float:
    """The run's gain on the goal's scale: accuracy points, or for a start above 0.5 the share of errors removed
    scaled so that halving the errors equals `min_gain`."""
    if before > 0.5:
        return (1 - (1 - after) / (1 - before)) * 2 * min_gain if before < 1 else 0.0
    return after - before


def draw_curves(runs: list[dict[str, Any]], path: Path, title: str, metric: str = "heldout_accuracy") -> None:
    """Held-out `metric` per evaluation, by step and by minutes from the run's start, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for r in runs:
        steps = [c["step"] for c in r["curve"]]
        minutes = [c["elapsed_s"] / 60 for c in r["curve"]]
        accuracy = [c[metric] for c in r["curve"]]
        axes[0].plot(steps, accuracy, marker="o", label=f"seed {r['seed']}")
        axes[1].plot(minutes, accuracy, marker="o", label=f"seed {r['seed']}")
    for ax, xlabel in zip(axes, ("GRPO step", "minutes from the run's start"), strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"held-out {metric.removeprefix('heldout_')}")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/train_arithmetic.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--metric", default="heldout_accuracy", help="the metrics.jsonl key of the goal")
    parser.add_argument("--min-gain", type=float, default=0.25)
    parser.add_argument("--max-wall-s", type=float, default=1800.0)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    parser.add_argument("--name", default="learning", help="run folders, plots and results file are named after it")
    parser.add_argument("--out", default=None)
    parser.add_argument("--read-only", action="store_true", help="summarize the runs already in --runs-dir")
    parser.add_argument("--nproc", type=int, default=1, help="torchrun ranks per run (1: one process, no torchrun)")
    args = parser.parse_args()
    runs_dir = Path(args.runs_dir)
    before, after = f"{args.metric}_before", f"{args.metric}_after"
    runs = [read_run(run_dir(runs_dir, args.name, seed), seed, args.name, metric=args.metric) if args.read_only
            else run_seed(args.config, seed, args.set, runs_dir, args.name, args.metric, args.nproc)
            for seed in args.seeds]  # fmt: skip
    for r in runs:
        gains = [
            c["elapsed_s"] for c in r["curve"] if improved(r[before], c[args.metric], args.min_gain) >= args.min_gain
        ]
        r["time_to_gain_s"] = gains[0] if gains else None
    print(table(["seed", "before", "after", "steps", "gain reached at s", "wall s"],
                [[r["seed"], r[before], r[after], r["steps"],
                  r["time_to_gain_s"] if r["time_to_gain_s"] is not None else "never", r["wall_s"]] for r in runs]))  # fmt: skip
    goals = []
    for r in runs:
        gain = improved(r[before], r[after], args.min_gain)
        goals.append(Goal(f"seed {r['seed']} {args.metric} gain", gain, ">=", args.min_gain))
        reached = r["time_to_gain_s"] if r["time_to_gain_s"] is not None else float("inf")
        goals.append(Goal(f"seed {r['seed']} gain reached at", reached, "<=", args.max_wall_s, unit=" s", digits=0))
    first = runs[0]
    results = {"config": args.config, "overrides": args.set, "metric": args.metric, **{k: first[k] for k in (
        before, after, "steps", "wall_s", "seed", "time_to_gain_s")},
        "runs": runs}  # fmt: skip
    curve = RESULTS / f"{args.name}_curve.png"
    draw_curves(runs, curve, f"GRPO, {Path(args.config).stem}, 2-core CPU", args.metric)
    results["curve_plot"] = str(curve.relative_to(ROOT))
    save(args.name, results, out=args.out, goal=verdict(*goals))


if __name__ == "__main__":
    main()
