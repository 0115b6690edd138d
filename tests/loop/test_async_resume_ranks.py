"""An async run (max_staleness 1) on two torchrun ranks, killed (-9, every rank) after a checkpoint taken while each
rank had groups in flight, resumes with every rank's own pending groups: every task of the run is trained exactly
once, on one rank, whatever the kill interrupted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from support.launch import free_port_pair
from support.processes import cli_env, wait_until
from support.train_runs import write_train_config

from agentic_rl.train.checkpoints import STATE_FILE, latest_checkpoint, load_state

ROOT = Path(__file__).resolve().parents[2]
STEPS, PER_RANK = 4, 2  # tasks per rank and step; 3 samples each


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port_pair()}",
            "-m", "agentic_rl.cli", *args, "--no-progress"]  # fmt: skip


def _trained(run: Path) -> list:
    return [t for r in (0, 1) for line in (run / f"task_ids_rank{r}.jsonl").read_text().splitlines()
            for t in json.loads(line)["task_ids"]]  # fmt: skip


@pytest.mark.slow
def test_every_ranks_pending_groups_come_back_after_a_kill(tmp_path):
    path = write_train_config(tmp_path, steps=STEPS, checkpoint_every=1, keep_checkpoints=2,
                              reward="support.toy_rewards:e_share_held")  # fmt: skip
    config = yaml.safe_load(path.read_text())
    config["rollout"]["max_staleness"] = 1
    path.write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    log = tmp_path / "killed.log"
    hold = str(3 * PER_RANK * 3)  # per process: batches 0-2 get their rewards, later calls hang until the kill
    with log.open("wb") as out:  # its own session: the kill reaches the launcher and both ranks at once
        launcher = subprocess.Popen(_torchrun("train", "--config", str(path)), stdout=out, stderr=subprocess.STDOUT,
                                    env=cli_env(TOY_REWARD_HOLD_AFTER=hold), cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        wait_until(launcher, lambda: (run / "checkpoints/step_2" / STATE_FILE).is_file(), what="step_2", log=log,
                   timeout_s=900)  # fmt: skip
    finally:
        ranks = psutil.Process(launcher.pid).children(recursive=True)
        os.killpg(launcher.pid, signal.SIGKILL)
        for p in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        launcher.wait()
        psutil.wait_procs(ranks, timeout=60)
    state = load_state(latest_checkpoint(run / "checkpoints", final_step=STEPS).path)
    pending = [saved["pending"] for saved in state["rollout"]["ranks"]]
    assert len(pending) == 2 and all(pending), pending  # each rank had its own groups in flight
    proc = subprocess.run(_torchrun("train", "--resume", str(run)), capture_output=True, text=True, timeout=900,
                          env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    trained = _trained(run)
    assert len(trained) == len(set(trained)) == STEPS * 2 * PER_RANK  # none twice, none lost
