"""The `agentic-rl eval` command end to end, in a subprocess, on the tiny model: its figures equal a direct
computation from the trajectories it wrote, and `--compare` with the same model gives a paired difference of 0."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import Counter

from support.processes import cli_command

from agentic_rl.cli.command import main
from agentic_rl.rewards.passk import vote_answer

K = 2
# a reward that marks some random samples correct: the final message's length is a multiple of 3
REWARD = 'def by3(task, messages):\n    return float(len(messages[-1]["content"]) % 3 == 0)\n'


def _direct(records, n_tasks):
    """pass@k, avg@K, maj@K, tool-call rate and mean turns computed straight from the trajectory records."""
    groups = [sorted((r for r in records if r["idx"] // K == t), key=lambda r: r["idx"]) for t in range(n_tasks)]
    per_task = []
    for group in groups:
        correct = [r["metrics"]["res_reward"] > 0 for r in group]
        answers = [vote_answer("evalreward:by3", r["chat_completions"]) for r in group]
        votes = Counter(a for a in answers if a is not None)
        top = max(votes.values()) if votes else 0
        winner = next((a for a in answers if a is not None and votes[a] == top), None)
        n, c = len(group), sum(correct)
        per_task.append({
            "n": n, "c": c, "answers": answers, "majority_answer": winner,
            "majority_correct": winner is not None and correct[answers.index(winner)],
            "pass@k": {str(k): 1 - math.comb(n - c, k) / math.comb(n, k) for k in range(1, n + 1)},
        })  # fmt: skip
    ok = [r for r in records if not r["failed"]]
    figures = {
        "pass@k": {str(k): sum(t["pass@k"][str(k)] for t in per_task) / n_tasks for k in range(1, K + 1)},
        "avg@K": sum(r["metrics"]["res_reward"] > 0 for r in records) / len(records),
        "maj@K": sum(t["majority_correct"] for t in per_task) / n_tasks,
        "tool_call_rate": sum(r["metrics"]["tool_calls"] > 0 for r in ok) / len(ok),
        "mean_turns": sum(r["metrics"]["steps"] for r in ok) / len(ok),
    }
    return per_task, figures


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_figures_equal_a_direct_computation_and_compare_with_itself_differs_by_zero(tmp_path, gsm8k_rows):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows[:3]))
    (tmp_path / "evalreward.py").write_text(REWARD)
    out = tmp_path / "eval"
    cmd = cli_command("eval", "--model", "tiny-random-smollm2", "--data", str(data), "-k", str(K), "--max-tokens", "16",
                      "--reward", "evalreward:by3", "--compare", "tiny-random-smollm2", "--bootstrap", "200",
                      "--output-dir", str(out), "--no-progress")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass@2" in proc.stdout and "paired difference of avg@K" in proc.stdout

    result = json.loads((out / "eval.json").read_text())
    records = _records(out / "trajectories.jsonl")
    assert sorted(r["idx"] for r in records) == list(range(3 * K))
    per_task, figures = _direct(records, 3)
    rows = _records(out / "tasks.jsonl")
    assert [row["id"] for row in rows] == [0, 1, 2]
    for row, direct in zip(rows, per_task, strict=True):
        assert {key: row[key] for key in direct} == direct
    for key, value in figures.items():
        assert result[key] == value, key
    assert (result["tasks"], result["samples"], result["failed"], result["failures"]) == (3, K, 0, {})
    # the same model on the same tasks and seeds samples the same: a paired difference of exactly 0
    assert _records(out / "compare" / "tasks.jsonl") == rows
    paired = result["compare"]["paired"]
    assert paired["difference"] == 0.0 and paired["interval_95"] == [0.0, 0.0]
    assert paired["per_task"] == [0.0, 0.0, 0.0] and paired["bootstrap_resamples"] == 200


def test_eval_usage_errors_exit_2_before_an_engine_starts(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    assert main(["eval", "--data", str(data), "--tools", "nope"]) == 2
    assert "--tools" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trajectories.jsonl").write_text("")
    assert main(["eval", "--data", str(data), "--output-dir", str(tmp_path / "run")]) == 2
