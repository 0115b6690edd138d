"""Bounded-staleness training end to end on the tiny random model: `max_staleness: 0` is exactly the lockstep loop
(weights and metrics, bit for bit), and `max_staleness: 1` (both placements) trains every task once within the
bound, each token's weight version recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from support.processes import cli_command, run
from support.train_runs import write_train_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _config(folder: Path, **rollout) -> Path:
    path = write_train_config(folder, steps=STEPS)
    config = yaml.safe_load(path.read_text())
    config["rollout"].update(rollout)
    path.write_text(yaml.safe_dump(config))
    return path


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_staleness_zero_is_the_lockstep_loop_bit_for_bit(tmp_path):
    path = _config(tmp_path / "async", max_staleness=0)
    run(cli_command("train", "--config", str(path), "--no-progress"))
    reference = _config(tmp_path / "lockstep")
    out = tmp_path / "lockstep.json"
    run([sys.executable, str(ROOT / "tests/support/lockstep_reference.py"), str(reference), str(out)])
    expected = json.loads(out.read_text())
    rows = _rows(tmp_path / "async" / "run")
    assert [{key: r[key] for key in expected["rows"][0]} for r in rows] == expected["rows"]
    assert (tmp_path / "async/run/weights_rank0.sha256").read_text().strip() == expected["digest"]
    assert all(r["tokens_lag_0"] == r["tokens_trained"] for r in rows)  # every token sampled by current weights


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["overlap", "pause"])
def test_staleness_one_trains_every_task_once_within_the_bound(tmp_path, placement):
    path = _config(tmp_path, max_staleness=1, placement=placement)
    run(cli_command("train", "--config", str(path), "--no-progress"))
    run_dir = tmp_path / "run"
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["groups_trained"] == 2 and r["groups_dropped_stale"] == 0
        assert r["tokens_lag_0"] + r["tokens_lag_1"] == r["tokens_trained"]  # no token older than one version
        assert r["tokens_sampled"] == r["tokens_trained"] + r["tokens_excluded"]
    ids = [i for line in (run_dir / "task_ids_rank0.jsonl").read_text().splitlines() for i in json.loads(line)["task_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * 2
    for step in range(1, STEPS + 1):  # each token's version: at most one behind the weights its step updated
        for record in map(json.loads, (run_dir / f"rollouts/step_{step}.jsonl").read_text().splitlines()):
            versions = [v for v, m in zip(record["weight_versions"], record["response_mask"], strict=True) if m]
            assert versions and all(step - 2 <= v <= step - 1 for v in versions)


@pytest.mark.slow
def test_truncated_sampling_is_trained_on_the_distribution_it_was_drawn_from(tmp_path):
    """With temperature 0.7 and top_p 0.8 the engine reports processed logprobs and the trainer computes the same
    tempered, truncated distribution: before the first update they agree (importance weights of 1)."""
    path = write_train_config(tmp_path, steps=1)
    config = yaml.safe_load(path.read_text())
    config["rollout"]["sampling"].update(temperature=0.7, top_p=0.8)
    path.write_text(yaml.safe_dump(config))
    run(cli_command("train", "--config", str(path), "--no-progress"))
    (row,) = _rows(tmp_path / "run")
    assert row["logprob_diff"] < 1e-3
    assert row["is_weight_mean"] == pytest.approx(1.0, abs=0.01) and row["is_truncated_fraction"] == 0.0
