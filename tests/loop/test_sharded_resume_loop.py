"""`agentic-rl train` under torchrun with `optimizer.sharding: fsdp`: every rank writes the sharded checkpoints, and a
run resumed from `step_1` ends on the uninterrupted run's weights and metrics; `merge` of its final checkpoint is
those weights."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.launch import free_port_pair
from support.processes import cli_env
from support.train_runs import write_train_config

from agentic_rl.cli import main
from agentic_rl.train.checkpoints import weights_digest
from agentic_rl.train.sharded_checkpoints import is_sharded_checkpoint

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("loss", "grad_norm", "reward_mean", "weight_version", "tokens_trained")


def _torchrun(*args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port_pair()}",
           "-m", "agentic_rl.cli", "train", *args, "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=cli_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _rows(run: Path) -> list[list]:
    return [[json.loads(line)[k] for k in KEYS] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_sharded_run_resumed_from_its_shards_ends_as_the_uninterrupted_one(tmp_path):
    optimizer = {"lr": 1.0e-3, "micro_batch_size": 3, "sharding": "fsdp"}
    _torchrun("--config", str(write_train_config(tmp_path, checkpoint_every=1, optimizer=optimizer)))
    run = tmp_path / "run"
    assert all(is_sharded_checkpoint(run / "checkpoints" / name) for name in ("step_1", "step_2", "final"))
    digests = [(run / f"weights_rank{r}.sha256").read_text() for r in (0, 1)]
    assert digests[0] == digests[1]

    resumed = tmp_path / "resumed"  # as if killed after step_1: its later checkpoints and digests never written
    shutil.copytree(run, resumed)
    for name in ("step_2", "final"):
        shutil.rmtree(resumed / "checkpoints" / name)
    for r in (0, 1):
        (resumed / f"weights_rank{r}.sha256").unlink()
    config = json.loads((resumed / "config.json").read_text())
    (resumed / "config.json").write_text(json.dumps({**config, "output_dir": str(resumed)}))
    _torchrun("--resume", str(resumed))
    assert [(resumed / f"weights_rank{r}.sha256").read_text() for r in (0, 1)] == digests
    assert _rows(resumed) == _rows(run)  # the engine got step 1's weights at their version: same rollouts

    from transformers import AutoModelForCausalLM

    assert main(["merge", "--checkpoint", str(run / "checkpoints" / "final"), "--out", str(tmp_path / "merged")]) == 0
    assert weights_digest(AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))) + "\n" == digests[0]
