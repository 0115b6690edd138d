"""An async run (`rollout.max_staleness: 1`) over a parquet file whose extra columns are a timestamp and a decimal
(Python `datetime` and `Decimal` in each task) checkpoints and resumes: its checkpoints hold only task order
positions and ids (readable with `torch.load(weights_only=True)`), and killed (kill -9) after its step 2 checkpoint
and resumed, it trains the same tasks step by step as an uninterrupted run, across the end of the first epoch (5
tasks, 2 per step: the batch spanning it holds no task twice)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.processes import cli_command, complete_lines, kill9, run, start, wait_until
from support.train_runs import write_train_config

from agentic_rl.train.checkpoints import STATE_FILE, latest_checkpoint, load_state

STEPS, PER_STEP = 4, 2 * 3  # trajectories (reward calls) per step: 2 tasks x 3 samples


def _write_parquet(path: Path) -> None:
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 5
    table = pa.table({
        "id": pa.array([f"q{i}" for i in range(n)]),
        "question": pa.array([f"What is {i} + {i}?" for i in range(n)]),
        "answer": pa.array([str(2 * i) for i in range(n)]),
        "created": pa.array([datetime.datetime(2024, 1, 1 + i, 12, 30) for i in range(n)], type=pa.timestamp("us")),
        "price": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)], type=pa.decimal128(10, 2)),
    })  # fmt: skip
    pq.write_table(table, path)


def _config(folder: Path, data: Path) -> Path:
    settings = {"steps": STEPS, "checkpoint_every": 1, "keep_checkpoints": 2, "reward": "support.toy_rewards:e_share_held",
                "data": str(data)}  # fmt: skip
    path = write_train_config(folder, **settings)
    config = yaml.safe_load(path.read_text())
    config["rollout"]["max_staleness"] = 1
    path.write_text(yaml.safe_dump(config))
    return path


def _steps(run_dir: Path) -> list[list]:
    """The task ids each step trained, in order (`task_ids_rank0.jsonl`)."""
    return [json.loads(line)["task_ids"] for line in (run_dir / "task_ids_rank0.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_an_async_run_over_tabular_data_resumes_exactly_from_a_checkpoint(tmp_path):
    data = tmp_path / "tasks.parquet"
    _write_parquet(data)
    paths = {name: _config(tmp_path / name, data) for name in ("reference", "killed")}
    reference = start(cli_command("train", "--config", str(paths["reference"]), "--no-progress"), tmp_path / "ref.log")
    killed = start(cli_command("train", "--config", str(paths["killed"]), "--no-progress"), tmp_path / "killed.log",
                   TOY_REWARD_HOLD_AFTER=str(3 * PER_STEP))  # batches 0-2 get rewards; later calls hang  # fmt: skip
    run_dir = tmp_path / "killed" / "run"
    try:
        wait_until(killed, lambda: complete_lines(run_dir / "metrics.jsonl") >= 2
                   and (run_dir / "checkpoints" / "step_2" / STATE_FILE).is_file(),
                   what="steps 1-2 and the step 2 checkpoint", log=tmp_path / "killed.log", timeout_s=600)  # fmt: skip
        kill9(killed)
        assert reference.wait(timeout=600) == 0, (tmp_path / "ref.log").read_text()[-4000:]
    finally:
        reference.kill()
        killed.kill()
    state = load_state(latest_checkpoint(run_dir / "checkpoints", final_step=STEPS).path)  # weights_only=True
    (saved,) = state["rollout"]["ranks"]  # one rank: its own pending groups
    pending = saved["pending"]
    assert pending  # admitted groups were in flight at the checkpoint
    assert all(set(p) == {"batch", "position", "order", "task_id"} for p in pending)  # no task dict
    assert all(isinstance(p["order"], int) and p["task_id"].startswith("q") for p in pending)

    run(cli_command("train", "--resume", str(run_dir), "--no-progress"))
    expected = _steps(tmp_path / "reference" / "run")
    assert _steps(run_dir) == expected  # the same tasks, step by step
    assert len(expected) == STEPS and all(len(ids) == len(set(ids)) == 2 for ids in expected)
    trained = [i for ids in expected for i in ids]
    assert sorted(trained[:5]) == [f"q{i}" for i in range(5)]  # the first epoch: every task once
    assert (run_dir / "checkpoints" / "final" / STATE_FILE).is_file()
