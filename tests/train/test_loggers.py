"""Metrics loggers read back from what they wrote: JSON Lines, TensorBoard event files, a wandb offline run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.wandb_records import config as wandb_config
from support.wandb_records import history as wandb_history

from agentic_rl.errors import ConfigError
from agentic_rl.train.loggers import JsonlLogger, MetricsLogger, TensorBoardLogger, build_loggers

ROWS = [{"step": k, "reward_mean": 0.25 * k, "loss": 1.0 / k, "accuracy": 0.5, "failed": 0, "weight_version": k,
         "note": "text is kept only in JSON Lines", "nan_metric": float("nan")} for k in (1, 2, 3)]  # fmt: skip


def _log_all(logger):
    for row in ROWS:
        logger.log(row, step=row["step"])
    logger.close()


def test_jsonl_logger_appends_one_row_per_step(tmp_path):
    _log_all(JsonlLogger(tmp_path / "metrics.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["note"] == ROWS[1]["note"]


def test_tensorboard_logger_writes_scalars_read_back_by_event_accumulator(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb")
    assert isinstance(logger, MetricsLogger)
    _log_all(logger)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward_mean", "loss", "accuracy", "failed", "weight_version"}
    rewards = events.Scalars("reward_mean")
    assert [e.step for e in rewards] == [1, 2, 3]
    assert [e.value for e in rewards] == pytest.approx([0.25, 0.5, 0.75])
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([1.0, 0.5, 1 / 3])


_WANDB_RUN = """
import json, sys
from agentic_rl.train.loggers import WandbLogger
rows = json.loads(sys.argv[2])
logger = WandbLogger(sys.argv[1], project="unit", name="run-a", config={"lr": 0.001, "model": "tiny"})
for row in rows:
    logger.log(row, step=row["step"])
logger.close()
print(logger.run_dir)
"""


def test_wandb_logger_writes_an_offline_run_with_history_and_config(tmp_path):
    # In a fresh interpreter, as `agentic-rl train` runs it: once, late in a full in-process test session, the
    # offline run file of this test held no history records (not reproduced alone or in smaller sessions).
    env = {**os.environ, "WANDB_MODE": "online"}  # the logger itself must choose offline
    proc = subprocess.run([sys.executable, "-c", _WANDB_RUN, str(tmp_path), json.dumps(ROWS)], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-")
    (run_file,) = run_dir.glob("run-*.wandb")
    rows = wandb_history(run_file)
    assert [r["_step"] for r in rows] == [1, 2, 3]
    assert [r["reward_mean"] for r in rows] == pytest.approx([0.25, 0.5, 0.75])
    assert "note" not in rows[0] and "nan_metric" not in rows[0]
    assert {k: v for k, v in wandb_config(run_file).items() if not k.startswith("_")} == {"lr": 0.001, "model": "tiny"}


def test_build_loggers_names_bad_choices(tmp_path):
    assert [type(x).__name__ for x in build_loggers(["jsonl"], tmp_path)] == ["JsonlLogger"]
    with pytest.raises(ConfigError, match="unknown logger.*mlflow"):
        build_loggers(["jsonl", "mlflow"], tmp_path)
    with pytest.raises(ConfigError, match="must not repeat"):
        build_loggers(["jsonl", "jsonl"], tmp_path)


def test_resumed_loggers_keep_the_steps_before_resume_from_once(tmp_path):
    """A run killed after logging step 3 (mid-way through writing the next line) and resumed from step 2: each sink
    holds steps 1-3 once, with the resumed run's values for step 3."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for sink in build_loggers(["jsonl", "tensorboard"], tmp_path):
        _log_all(sink)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward_m')
    again = {**ROWS[2], "reward_mean": -1.0}
    for sink in build_loggers(["jsonl", "tensorboard"], tmp_path, resume_from=3):
        sink.log(again, step=3)
        sink.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.25), (2, 0.5), (3, -1.0)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5), (3, -1.0)]
    (tmp_path / "metrics.jsonl").write_text('{"no step": 1}\n')
    with pytest.raises(ConfigError, match="metrics.jsonl:1: not a row with an integer 'step'"):
        JsonlLogger(tmp_path / "metrics.jsonl", resume_from=1)
