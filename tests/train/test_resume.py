"""`agentic-rl train --resume`: checkpoints a kill cannot leave half-written, and a run killed mid-way (during a step,
or while saving a checkpoint) that resumes into the same weights and metrics as an uninterrupted run.

The end-to-end tests run real subprocesses on the tiny random model. The killed run is stopped at a known point by
`support.toy_rewards:e_share_held`: its reward calls after step 2's block, so once `metrics.jsonl` has two rows and
`checkpoints/step_2/` exists the process is inside step 3's rollout and stays there until `kill -9`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from support.processes import cli_command, complete_lines, kill9, run, start, wait_until
from support.train_runs import write_train_config

from agentic_rl.cli import main
from agentic_rl.train.checkpoints import (
    STATE_FILE,
    capture_rng_state,
    discard_partial,
    latest_checkpoint,
    load_state,
    prune_checkpoints,
    restore_rng_state,
    save_checkpoint,
    write_atomically,
)

# ---- checkpoint files --------------------------------------------------------------------------------------------


class _Saves:
    """Stands for a model and a tokenizer: `save_pretrained` writes one file."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / self.name).write_text(self.name)


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_partial_folder(tmp_path):
    root = tmp_path / "checkpoints"
    save_checkpoint(root / "step_1", _Saves("model"), _Saves("tokenizer"), {"step": 1})
    assert load_state(root / "step_1") == {"step": 1}

    def broken(tmp: Path) -> None:
        (tmp / "model").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(root / "step_2", broken)
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]
    write_atomically(root / "step_1", lambda tmp: (tmp / STATE_FILE).write_bytes(b"new"))  # replaces as a whole
    assert [p.name for p in (root / "step_1").iterdir()] == [STATE_FILE]


def test_latest_checkpoint_skips_partial_folders_and_prune_keeps_the_newest(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 10):
        save_checkpoint(root / f"step_{step}", _Saves("model"), _Saves("tokenizer"), {"step": step})
    (root / ".tmp-step_11-abc").mkdir()  # what a kill during a save leaves
    (root / ".trash-step_0-def").mkdir()  # ... and during a removal
    (root / "step_12").mkdir()  # a folder without a training state is not a checkpoint
    latest = latest_checkpoint(root, final_step=20)
    assert (latest.path.name, latest.step) == ("step_10", 10)  # by number, not by name
    assert sorted(p.name for p in discard_partial(root)) == [".tmp-step_11-abc", ".trash-step_0-def"]
    assert [p.name for p in prune_checkpoints(root, keep=2)] == ["step_1", "step_2"]
    assert sorted(p.name for p in root.iterdir()) == ["step_10", "step_12", "step_3"]
    assert prune_checkpoints(root, keep=0) == []  # 0 keeps all
    save_checkpoint(root / "final", _Saves("model"), _Saves("tokenizer"), {"step": 20})
    assert latest_checkpoint(root, final_step=20).step == 20
    assert latest_checkpoint(tmp_path / "none", final_step=20) is None


def test_rng_states_survive_a_save_and_load(tmp_path):
    import random

    import numpy as np
    import torch

    state = capture_rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    save_checkpoint(tmp_path / "step_1", _Saves("model"), _Saves("tokenizer"), {"rng": state})
    restore_rng_state(load_state(tmp_path / "step_1")["rng"])  # through torch.load(weights_only=True)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


# ---- command line ------------------------------------------------------------------------------------------------


def test_train_resume_is_given_alone_and_a_new_run_does_not_overwrite_an_old_one(tmp_path, capsys):
    path = write_train_config(tmp_path)
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "config.json does not exist" in capsys.readouterr().err
    assert main(["train"]) == 2
    assert "--config FILE for a new run, or --resume RUN_DIR" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path), "--set", "steps=9"]) == 2
    assert "--set cannot change it" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["train", "--config", str(path), "--no-progress"]) == 2  # refused before any engine starts
    assert "already holds a training run (metrics.jsonl)" in capsys.readouterr().err


# ---- killed runs, end to end -------------------------------------------------------------------------------------

STEPS, PER_STEP = 4, 2 * 3  # trajectories (reward calls) per step: 2 tasks x 3 samples
TIMING = {"rollout_seconds", "train_seconds", "sync_seconds", "step_seconds", "tokens_per_s", "samples_per_s"}  # wall-clock, differs between runs


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _wandb_steps(run_dir: Path) -> list[list[int]]:
    """The steps logged with metrics in each offline wandb run file of `run_dir`, oldest first."""
    from support.wandb_records import history

    segments = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    return [[r["_step"] for r in history(path) if "loss" in r] for path in segments]


def _wandb_has(run_dir: Path, steps: list[list[int]]) -> bool:
    try:
        return _wandb_steps(run_dir) == steps
    except Exception:  # a record still being written
        return False


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted 4-step run and the same run killed (kill -9) during step 3, run side by side."""
    base = tmp_path_factory.mktemp("runs")
    settings = {"steps": STEPS, "checkpoint_every": 1, "keep_checkpoints": 2, "reward": "support.toy_rewards:e_share_held",
                "loggers": ["jsonl", "tensorboard", "wandb"]}  # fmt: skip
    configs = {name: write_train_config(base / name, **settings) for name in ("reference", "killed")}
    command = {name: cli_command("train", "--config", str(path), "--no-progress") for name, path in configs.items()}
    reference = start(command["reference"], base / "reference.log")
    killed = start(command["killed"], base / "killed.log", TOY_REWARD_HOLD_AFTER=str(2 * PER_STEP))
    killed_dir = base / "killed" / "run"
    try:
        wait_until(killed, lambda: complete_lines(killed_dir / "metrics.jsonl") >= 2
                   and (killed_dir / "checkpoints" / "step_2" / STATE_FILE).is_file()
                   and _wandb_has(killed_dir, [[1, 2]]),
                   what="steps 1-2 in metrics.jsonl and wandb, and the step 2 checkpoint", log=base / "killed.log",
                   timeout_s=600)  # fmt: skip
        kill9(killed)
        assert reference.wait(timeout=600) == 0, (base / "reference.log").read_text()[-4000:]
    finally:
        reference.kill()
        killed.kill()
    # killed during step 3: its rollout was held, nothing of step 3 was written
    assert [r["step"] for r in _rows(killed_dir)] == [1, 2]
    assert not (killed_dir / "rollouts" / "step_3.jsonl").exists()
    assert sorted(p.name for p in (killed_dir / "checkpoints").iterdir()) == ["step_1", "step_2"]
    return base / "reference" / "run", killed_dir


def _resume_copy(killed: Path, to: Path) -> Path:
    """A copy of the killed run to resume (each test resumes its own; the folder may move: RUN_DIR wins)."""
    shutil.copytree(killed, to)
    run(cli_command("train", "--resume", str(to), "--no-progress"))
    return to


def _assert_same_as_reference(resumed: Path, reference: Path) -> None:
    rows = _rows(resumed)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step once
    assert [r["weight_version"] for r in rows] == list(range(1, STEPS + 1))
    assert _without_timing(rows) == _without_timing(_rows(reference))  # exactly: same seeds, same arithmetic
    task_ids = (resumed / "task_ids_rank0.jsonl").read_text()
    assert task_ids == (reference / "task_ids_rank0.jsonl").read_text()  # the same tasks, each step once
    digest = (resumed / "weights_rank0.sha256").read_text()
    assert digest == (reference / "weights_rank0.sha256").read_text()  # bitwise-identical final weights
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["final", "step_3", "step_4"]


@pytest.mark.slow
def test_training_killed_during_a_step_resumes_to_the_weights_of_an_uninterrupted_run(runs, tmp_path):
    """Resumed from step 2: model, optimizer, RNG states, task order and weight version come back, and each step's
    rollout is seeded by the step, so steps 3-4 repeat the uninterrupted run bit for bit on this CPU (one OpenMP
    thread, fp32 engine and trainer; the engine reloads the checkpoint's exact fp32 weights)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reference, killed = runs
    resumed = _resume_copy(killed, tmp_path / "resumed")
    _assert_same_as_reference(resumed, reference)

    rows = _rows(resumed)
    events = EventAccumulator(str(resumed / "tensorboard"))
    events.Reload()  # the resumed process purged from step 3 on: each step once
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(r["step"], pytest.approx(r["loss"])) for r in rows]
    segments = sorted((resumed / "wandb").glob("offline-run-*"))
    assert len({s.name.rsplit("-", 1)[1] for s in segments}) == 1  # one run id, continued by the resumed process
    assert _wandb_steps(resumed) == [[1, 2], [3, 4]]


def _trained_task_ids(run_dir: Path) -> list:
    """Every task id the run trained, step after step (`task_ids_rank0.jsonl`)."""
    lines = (run_dir / "task_ids_rank0.jsonl").read_text().splitlines()
    return [task_id for line in lines for task_id in json.loads(line)["task_ids"]]


@pytest.mark.slow
def test_async_training_killed_mid_step_resumes_with_every_task_trained_exactly_once(runs, tmp_path):
    """With max_staleness 1 a checkpoint is taken while later groups are in flight; killed (kill -9) after it, the
    resumed run rolls those groups out again: every task of the run's order (the lockstep run's) is trained exactly
    once, each step once, and the run ends with a final checkpoint. Whatever the kill interrupted, this holds."""
    reference, _ = runs
    settings = {"steps": STEPS, "checkpoint_every": 1, "keep_checkpoints": 2, "reward": "support.toy_rewards:e_share_held"}
    path = write_train_config(tmp_path / "async", **settings)
    config = yaml.safe_load(path.read_text())
    config["rollout"]["max_staleness"] = 1
    path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "async" / "run"
    killed = start(cli_command("train", "--config", str(path), "--no-progress"), tmp_path / "async.log",
                   TOY_REWARD_HOLD_AFTER=str(3 * PER_STEP))  # batches 0-2 get rewards; later calls hang  # fmt: skip
    try:
        wait_until(killed, lambda: complete_lines(run_dir / "metrics.jsonl") >= 2
                   and (run_dir / "checkpoints" / "step_2" / STATE_FILE).is_file(),
                   what="steps 1-2 and the step 2 checkpoint", log=tmp_path / "async.log", timeout_s=600)  # fmt: skip
        kill9(killed)
    finally:
        killed.kill()
    start_from = latest_checkpoint(run_dir / "checkpoints", final_step=STEPS)
    state = load_state(start_from.path)
    assert state["rollout"]["ranks"][0]["pending"]  # admitted groups were in flight at the checkpoint
    assert len(_trained_task_ids(run_dir)) >= 2 * 2  # two steps of two tasks at least
    run(cli_command("train", "--resume", str(run_dir), "--no-progress"))
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["max_staleness"] == 1 and r["groups_trained"] == 2 for r in rows)
    assert sorted(_trained_task_ids(run_dir), key=str) == sorted(_trained_task_ids(reference), key=str)
    assert (run_dir / "checkpoints" / "final" / STATE_FILE).is_file()
    assert (run_dir / "weights_rank0.sha256").is_file()


@pytest.mark.slow
def test_training_killed_while_saving_a_checkpoint_resumes_from_the_previous_one(runs, tmp_path):
    """What a kill in the middle of saving step 3's checkpoint leaves: step 3's metrics row (logged before the
    save), a half-written next line, and the temporary checkpoint folder with a partial model file and no training
    state. The resumed run discards the folder, drops the row and the half line, and redoes step 3 from step 2."""
    reference, killed = runs
    broken = tmp_path / "broken"
    shutil.copytree(killed, broken)
    partial = broken / "checkpoints" / ".tmp-step_3-x1y2z3"
    shutil.copytree(broken / "checkpoints" / "step_2", partial, ignore=shutil.ignore_patterns(STATE_FILE))
    model = (partial / "model.safetensors").read_bytes()
    (partial / "model.safetensors").write_bytes(model[: len(model) // 2])
    row3 = {**_rows(broken)[-1], "step": 3}
    with (broken / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(row3) + "\n" + json.dumps(row3)[:30])

    run(cli_command("train", "--resume", str(broken), "--no-progress"))
    assert not partial.exists()
    _assert_same_as_reference(broken, reference)


@pytest.mark.slow
def test_a_run_killed_after_its_last_step_checkpoint_but_before_final_writes_the_rest(runs, tmp_path):
    """Its last step's checkpoint is there, `final/` and the digest are not: resumed, it runs no step and writes
    them (a finished run would start no engine)."""
    reference, _ = runs
    cut = tmp_path / "cut"
    shutil.copytree(reference, cut)
    shutil.rmtree(cut / "checkpoints" / "final")
    (cut / "weights_rank0.sha256").unlink()
    before = (cut / "metrics.jsonl").read_text()
    proc = run(cli_command("train", "--resume", str(cut), "--no-progress"))
    assert f"trained 0 steps after {STEPS} done before" in proc.stdout
    assert (cut / "checkpoints" / "final" / STATE_FILE).is_file()
    assert (cut / "weights_rank0.sha256").read_text() == (reference / "weights_rank0.sha256").read_text()
    assert (cut / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_a_finished_run_resumed_reports_its_steps_and_starts_no_engine(runs, tmp_path):
    reference, _ = runs
    finished = tmp_path / "finished"
    shutil.copytree(reference, finished)
    before = (finished / "metrics.jsonl").read_text()
    proc = run(cli_command("train", "--resume", str(finished), "--no-progress"))
    assert f"trained 0 steps after {STEPS} done before into {finished} ({STEPS} steps in all)" in proc.stdout
    assert "vLLM engine ready" not in proc.stderr
    assert (finished / "metrics.jsonl").read_text() == before


def test_a_checkpoint_folder_and_its_files_get_the_modes_the_umask_gives(tmp_path):
    import os
    import stat

    def write(folder: Path) -> None:
        fd = os.open(folder / "private.bin", os.O_WRONLY | os.O_CREAT, 0o600)  # as a temporary-file writer leaves it
        os.close(fd)
        (folder / "sub").mkdir(mode=0o700)
        (folder / "link").symlink_to(outside)  # a link's target is not the folder's to change

    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    outside.chmod(0o600)
    done = write_atomically(tmp_path / "step_1", write)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(done.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((done / "sub").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((done / "private.bin").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
