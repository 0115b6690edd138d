"""`agentic-rl rollout --reward llm_judge`: the judge asks the run's own engine, in process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_rollout_command_scores_with_the_llm_judge_on_its_own_engine(tmp_path, gsm8k_rows, model_dir):
    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in gsm8k_rows[:2]) + "\n")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentic_rl.cli", "rollout", "--model", str(model_dir), "--data", str(data),
           "--reward", "llm_judge", "--tools", "", "--max-steps", "1", "--max-tokens", "32",
           "--max-response-length", "128", "--kv-cache-gib", "0.25", "--output-dir", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert not r["failed"], r["error"]  # a judge that cannot be reached fails the trajectory
        assert r["metrics"]["res_reward"] in (0.0, 1.0)
