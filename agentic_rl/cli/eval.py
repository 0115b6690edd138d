"""The `agentic-rl eval` command: K samples per task with the rollout's machinery (same harness, tools, reward and
engine start as `agentic-rl rollout`), scored as pass@k, avg@K and maj@K (`agentic_rl.rewards.passk`), with
`--compare OTHER`'s paired difference and its bootstrap interval."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentic_rl.cli.rollout import run_tasks

__all__ = ["eval_figures", "run_eval", "task_rows"]


def task_rows(
    tasks: list[dict[str, Any]], records: list[dict[str, Any]], samples: int, reward: str
) -> list[dict[str, Any]]:
    """One row per task from its `samples` trajectory records (record `idx` = task * samples + sample): `id`, `n`,
    `c`, `pass@k` for each k <= n, `avg@K` (`task_pass_figures`: a sample is correct when `sample_correct`), the
    majority answer and whether it is correct, each sample's answer."""
    from agentic_rl.rewards.passk import majority_vote, sample_correct, task_pass_figures, vote_answer

    by_task: list[list[dict[str, Any]]] = [[] for _ in tasks]
    for record in sorted(records, key=lambda r: r["idx"]):
        by_task[record["idx"] // samples].append(record)
    rows = []
    for i, (task, group) in enumerate(zip(tasks, by_task, strict=True)):
        correct = [sample_correct(r.get("metrics")) for r in group]
        answers = [vote_answer(reward, r.get("chat_completions") or []) for r in group]
        majority, majority_correct = majority_vote(answers, correct)
        rows.append(
            {
                "id": task.get("id", i),
                **task_pass_figures(correct),
                "majority_answer": majority,
                "majority_correct": majority_correct,
                "answers": answers,
            }
        )
    return rows


def eval_figures(rows: list[dict[str, Any]], records: list[dict[str, Any]], samples: int) -> dict[str, Any]:
    """The evaluation's figures: means over tasks of pass@k (k = 1..K), avg@K and maj@K; over the finished samples,
    the tool-call rate (share with a tool call) and mean turns; failed samples counted by kind (`failure_kind` for a
    failure outside the policy, e.g. `tool`; else the text before the first `:` of the trajectory's `error`) and the
    retries such failures caused, by kind."""
    from agentic_rl.rewards.passk import mean_pass_at_k
    from agentic_rl.types import FailureKind

    ok = [r for r in records if not r.get("failed")]
    failures: dict[str, int] = {}
    for r in records:
        if r.get("failed"):
            cause = r.get("failure_kind") or str(r.get("error") or r.get("termination_reason") or "unknown")
            kind = cause.split(":", 1)[0]
            failures[kind] = failures.get(kind, 0) + 1
    retries = {kind.value: sum(int(r["metrics"].get(f"retries_{kind}", 0)) for r in records) for kind in FailureKind}
    t = len(rows)
    return {
        "tasks": t,
        "samples": samples,
        "pass@k": mean_pass_at_k(rows, samples),
        "avg@K": sum(row["avg@K"] for row in rows) / t,
        "maj@K": sum(row["majority_correct"] for row in rows) / t,
        "tool_call_rate": sum((r["metrics"].get("tool_calls", 0) > 0) for r in ok) / len(ok) if ok else 0.0,
        "mean_turns": sum(r["metrics"].get("steps", 0) for r in ok) / len(ok) if ok else 0.0,
        "failed": len(records) - len(ok),
        "failures": failures,
        "retries": {kind: n for kind, n in retries.items() if n},
    }


def _evaluate(
    args: argparse.Namespace, model: str, tasks: list[dict[str, Any]], out_dir: Path, console: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run K samples of each task on `model` as `agentic-rl rollout` runs tasks (trajectories.jsonl in `out_dir`),
    write tasks.jsonl, and return the task rows and the figures."""
    from agentic_rl.records import trajectory_to_dict

    k = args.samples
    run_args = argparse.Namespace(**{**vars(args), "model": model, "output_dir": str(out_dir)})
    expanded = [task for task in tasks for _ in range(k)]  # idx = task * K + sample: distinct seeds (derive_seed)
    trajectories, model_dir = run_tasks(run_args, expanded, out_dir, console)
    records = [trajectory_to_dict(t) for t in trajectories]
    rows = task_rows(tasks, records, k, args.reward)
    with (out_dir / "tasks.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return rows, {"model": str(model_dir), **eval_figures(rows, records, k)}


def _paired(rows: list[dict[str, Any]], other: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The paired difference per task of avg@K (= the unbiased pass@1 with n = K): model minus --compare, its mean
    and a percentile bootstrap interval over tasks (`bootstrap_interval`, seeded by --seed)."""
    from agentic_rl.rewards.passk import bootstrap_interval

    diffs = [a["avg@K"] - b["avg@K"] for a, b in zip(rows, other, strict=True)]
    low, high = bootstrap_interval(diffs, resamples=args.bootstrap, seed=args.seed)
    return {
        "metric": "avg@K",
        "difference": sum(diffs) / len(diffs),
        "interval_95": [low, high],
        "bootstrap_resamples": args.bootstrap,
        "bootstrap_seed": args.seed,
        "per_task": diffs,
    }


def run_eval(args: argparse.Namespace) -> int:
    """`agentic-rl eval`: evaluate `--model` (and `--compare`) on the tasks, write eval.json, print a table.

    Returns:
        0, or 1 when every sample failed.
    """
    from rich.console import Console

    from agentic_rl.data import load_tasks
    from agentic_rl.errors import ConfigError

    console = Console()
    tasks = load_tasks(args.data, args.limit, columns=args.data_columns)
    if not tasks:
        raise ConfigError(f"--data {args.data}: no tasks")
    out_dir = Path(args.output_dir or "runs/eval")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--output-dir {out_dir} is a file, not a folder")
    earlier = [name for name in ("eval.json", "trajectories.jsonl") if (out_dir / name).exists()]
    if earlier:
        raise ConfigError(f"--output-dir {out_dir} already holds a run ({', '.join(earlier)}): choose another")
    rows, figures = _evaluate(args, args.model, tasks, out_dir, console)
    result: dict[str, Any] = {
        **figures,
        "options": vars(args),
        "tie_break": "maj@K: most votes, ties to the answer given first (lowest sample index); no answer: no vote",
    }
    if args.compare is not None:
        other_rows, other = _evaluate(args, args.compare, tasks, out_dir / "compare", console)
        result["compare"] = {**other, "paired": _paired(rows, other_rows, args)}
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    _print_table(console, out_dir, result)
    if figures["failed"] == len(tasks) * args.samples:
        console.print("[red]every sample failed; see the errors in trajectories.jsonl")
        return 1
    return 0


def _print_table(console: Any, out_dir: Path, result: dict[str, Any]) -> None:
    """Print the figures (and the compared model's, with the paired difference) as a table."""
    from rich.table import Table

    table = Table(title=f"eval ({out_dir}): {result['tasks']} tasks x {result['samples']} samples")
    table.add_column("metric")
    columns = [result, *([result["compare"]] if "compare" in result else [])]
    for figures in columns:
        table.add_column(Path(figures["model"]).name, justify="right")
    names = [*(f"pass@{k}" for k in result["pass@k"]), "avg@K", "maj@K", "tool_call_rate", "mean_turns", "failed"]
    for name in names:
        key = ("pass@k", name[5:]) if name.startswith("pass@") else (name, None)
        cells = [f["pass@k"][key[1]] if key[1] else f[key[0]] for f in columns]
        table.add_row(name, *(f"{v:.3f}" if isinstance(v, float) else str(v) for v in cells))
    console.print(table)
    if "compare" in result:
        paired = result["compare"]["paired"]
        low, high = paired["interval_95"]
        console.print(
            f"paired difference of avg@K (model - compare): {paired['difference']:+.3f}, bootstrap 95% interval "
            f"[{low:+.3f}, {high:+.3f}] ({paired['bootstrap_resamples']} resamples, seed {paired['bootstrap_seed']})"
        )
