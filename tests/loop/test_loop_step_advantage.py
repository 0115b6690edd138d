"""`agentic-rl train` with step-level advantages (`optimizer.advantage: step`) on the tiny random model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.processes import cli_env
from support.train_runs import write_train_config

from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config

ROOT = Path(__file__).resolve().parents[2]


def test_step_advantage_settings_load_and_bad_values_name_their_key(tmp_path):
    path = write_train_config(tmp_path)
    config = load_train_config(path, ["optimizer.advantage=step", "optimizer.gamma=0.9"])
    assert (config.optimizer.advantage, config.optimizer.gamma) == ("step", 0.9)
    assert load_train_config(path, []).optimizer.advantage == "trajectory"
    with pytest.raises(ConfigError, match="optimizer.advantage"):
        load_train_config(path, ["optimizer.advantage=turn"])
    with pytest.raises(ConfigError, match="optimizer.gamma"):
        load_train_config(path, ["optimizer.gamma=2"])


@pytest.mark.slow
def test_one_step_of_step_level_training_completes_and_reports_metrics(tmp_path):
    """One optimizer step in step mode, with up to two turns per trajectory (a turn that calls the calculator gets a
    second one)."""
    path = write_train_config(tmp_path, steps=1)
    config = yaml.safe_load(path.read_text())
    config["optimizer"].update(advantage="step", gamma=0.9)
    config["rollout"]["max_steps"] = 2
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "agentic_rl.cli", "train", "--config", str(path), "--no-progress"],
                          capture_output=True, text=True, timeout=600, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["weight_version"] == 1
    assert row["tokens_sampled"] == row["tokens_trained"] + row["tokens_excluded"] > 0
    record = [json.loads(line) for line in (run / "rollouts/step_1.jsonl").read_text().splitlines()]
    kept = [t for t in record if not t["failed"]]
    assert kept and row["tokens_trained"] == sum(sum(t["response_mask"]) for t in kept)
    for t in record:  # the step rewards of each record add up to its reward
        assert sum(s["reward"] for s in t["steps"]) == pytest.approx(t["trajectory_reward"], abs=1e-9)
    assert row["reward_mean"] == pytest.approx(sum(t["trajectory_reward"] for t in kept) / len(kept), abs=1e-6)
    for key in ("loss", "grad_norm", "kl", "clip_fraction", "response_length", "zero_advantage_rows"):
        assert key in row
