"""HumanEval workspace tasks end to end: `agentic-rl rollout --environment workspace` and `agentic-rl train` of
`examples/train_humaneval.yaml` on the tiny model, with the hidden tests as the reward, token-exact records and
nothing left behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.leaks import mounts_in, processes_in
from support.processes import ROOT, cli_command, cli_env

pytestmark = pytest.mark.slow


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_rewarded_by_tests(record: dict) -> None:
    """A finished coding trajectory: its reward is its hidden test's verdict, its tokens what the engine sampled."""
    assert not record["failed"], record["error"]
    metrics = record["metrics"]
    # The hidden test ran in the trajectory's workspace (plain Python, not pytest: no test cases are counted), and
    # its exit status is the verdict.
    assert metrics["tests_run"] == 0 and metrics["workspace_overlay"] in (0.0, 1.0)
    assert metrics["res_reward"] == float(metrics["tests_exit_status"] == 0) == metrics["tests_passed_share"]
    assert metrics["alignment_mismatches"] == 0
    assert len(record["response_mask"]) == len(record["response_ids"]) == len(record["response_logprobs"])


def _left_in(root: Path) -> list[str]:
    """Workspace folders under `root`, processes whose working directory is in it and mounts below it."""
    folders = [str(p) for p in root.rglob("*") if p.is_dir()] if root.exists() else []
    return folders + processes_in(root) + mounts_in(root)


def test_rollout_runs_humaneval_tasks_in_workspaces_rewarded_by_their_hidden_tests(tmp_path):
    out = tmp_path / "rollout"
    cmd = cli_command("rollout", "--model", "tiny-random-smollm2", "--data", "humaneval[:3]", "--environment",
                      "workspace", "--reward", "workspace_tests", "--max-steps", "2", "--max-tokens", "32",
                      "--max-prompt-length", "2048", "--max-response-length", "1024", "--reward-timeout-s", "120",
                      "--kv-cache-gib", "0.1", "--output-dir", str(out), "--no-progress")  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=cli_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(out / "trajectories.jsonl")
    assert sorted(r["task_id"] for r in records) == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    for record in records:
        _check_rewarded_by_tests(record)
        assert record["chat_completions"][0]["role"] == "system"  # the workspace environment's own prompt
        assert "solution.py" in record["chat_completions"][1]["content"]


def test_train_runs_a_humaneval_step_with_token_exact_records_and_leaves_no_workspace(tmp_path):
    out, root = tmp_path / "run", tmp_path / "workspaces"
    overrides = ["model=tiny-random-smollm2", f"output_dir={out}", "steps=1", "eval_data=null", "checkpoint_every=0",
                 "rollout.tasks_per_step=1", "rollout.group_size=2", "rollout.max_steps=2",
                 "rollout.max_response_length=1024", "rollout.sampling.max_tokens=32", "rollout.dynamic_sampling=false",
                 "engine.kv_cache_gib=0.1",
                 f"environment={{class: workspace, kwargs: {{workspace: {{root: {root}}}}}}}"]  # fmt: skip
    cmd = cli_command("train", "--config", str(ROOT / "examples" / "train_humaneval.yaml"), "--no-progress")
    for override in overrides:
        cmd += ["--set", override]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=cli_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = _records(out / "metrics.jsonl")
    records = _records(out / "rollouts" / "step_1.jsonl")
    assert len(records) == 2 and row["failed"] == 0
    for record in records:
        _check_rewarded_by_tests(record)
    assert row["tokens_sampled"] == row["tokens_trained"] + row["tokens_excluded"]
    assert row["tokens_sampled"] == sum(sum(r["response_mask"]) for r in records)
    assert row["refused"] == 0 and all(r["refused"] is None for r in records)  # exactly what the engine sampled
    if len({r["trajectory_reward"] for r in records}) > 1:  # a group with a reward spread trains its tokens
        assert row["tokens_trained"] > 0 and row["logprob_diff"] < 1e-3  # fp32 engine and trainer agree
    assert _left_in(root) == []
