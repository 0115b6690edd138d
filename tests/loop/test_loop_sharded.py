"""`agentic-rl train` under torchrun with `optimizer.sharding: fsdp` on the tiny random model, end to end: two
sharded ranks train, sync from their shards into both engines, checkpoint every step; a run killed after its first
checkpoint (launcher and ranks) resumes onto the uninterrupted run's weights; the final checkpoint merges into a plain folder that
`agentic-rl rollout` serves."""

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
from support.launch import free_port_pair
from support.processes import cli_command, cli_env, wait_until
from support.train_runs import write_train_config

ROOT = Path(__file__).resolve().parents[2]
SHARDED = {"lr": 1.0e-3, "micro_batch_size": 2, "sharding": "fsdp"}


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port_pair()}",
            "-m", "agentic_rl.cli", *args, "--no-progress"]  # fmt: skip


def _rows(run: Path) -> list[list]:
    keys = ("step", "loss", "grad_norm", "reward_mean", "weight_version", "tokens_trained")
    return [[json.loads(line)[k] for k in keys] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _digests(run: Path) -> set[str]:
    return {(run / f"weights_rank{r}.sha256").read_text().strip() for r in (0, 1)}


@pytest.mark.slow
def test_two_sharded_ranks_train_resume_after_a_kill_and_merge_into_a_servable_model(tmp_path):
    whole = write_train_config(tmp_path / "whole", steps=3, checkpoint_every=1, keep_checkpoints=0, optimizer=SHARDED)
    proc = subprocess.run(_torchrun("train", "--config", str(whole)), capture_output=True, text=True, timeout=900,
                          env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "whole/run"
    (digest,) = _digests(run)  # every rank gathered the same weights
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [2, 3, 4]  # version 1: rank 0's weights, pushed at the start
    assert all(r["grad_norm"] > 0 for r in rows)
    # steps 2 and 3 trained on tokens the engines sampled after a sync from the shards: their logprobs are the
    # trainer's own (fp32 on both sides) when each engine got all of the gathered weights
    assert all(r["logprob_diff"] < 1e-3 for r in rows), [r["logprob_diff"] for r in rows]
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"step_1", "step_2", "step_3", "final"}

    # the same run, killed (-9, every rank) once its first checkpoint is complete, then resumed
    killed = write_train_config(tmp_path / "killed", steps=3, checkpoint_every=1, keep_checkpoints=0, optimizer=SHARDED)
    again = tmp_path / "killed/run"
    log = tmp_path / "killed.log"
    with log.open("wb") as out:  # its own session: the kill reaches the launcher and both ranks at once
        launcher = subprocess.Popen(_torchrun("train", "--config", str(killed)), stdout=out, stderr=subprocess.STDOUT,
                                    env=cli_env(), cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        wait_until(launcher, lambda: (again / "checkpoints/step_1/training_state.pt").is_file(), what="step_1",
                   log=log, timeout_s=900)  # fmt: skip
    finally:  # torchrun starts each rank in a session of its own: the ranks (and theirs) are killed one by one
        ranks = psutil.Process(launcher.pid).children(recursive=True)
        os.killpg(launcher.pid, signal.SIGKILL)
        for proc in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        launcher.wait()
        psutil.wait_procs(ranks, timeout=60)
    assert not (again / "checkpoints/final").exists()
    proc = subprocess.run(_torchrun("train", "--resume", str(again)), capture_output=True, text=True, timeout=900,
                          env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _digests(again) == {digest}  # bit-exact: the resumed run ends on the uninterrupted run's weights
    assert _rows(again) == _rows(run)  # its engines got step 1's weights at their version: the same rollouts

    merged = tmp_path / "merged"
    proc = subprocess.run(cli_command("merge", "--checkpoint", str(run / "checkpoints/final"), "--out", str(merged)),
                          capture_output=True, text=True, timeout=600, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    from agentic_rl.loop import weights_digest

    assert weights_digest(AutoModelForCausalLM.from_pretrained(str(merged))) == digest
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    out = tmp_path / "rollout"
    proc = subprocess.run(cli_command("rollout", "--model", str(merged), "--data", str(data), "--limit", "1",
                                      "--max-tokens", "16", "--max-response-length", "64", "--kv-cache-gib", "0.1",
                                      "--output-dir", str(out), "--no-progress"),
                          capture_output=True, text=True, timeout=600, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert not record["failed"] and record["response_ids"], record.get("error")


def test_one_process_trains_with_every_memory_lever_on(tmp_path):
    """FSDP2 on one process (a group of its own: `cpu_offload`), bf16 compute over fp32 master weights, activation
    checkpointing: the run trains, syncs from its offloaded shards into the engine, and writes sharded checkpoints."""
    from agentic_rl.train.sharded_checkpoints import is_sharded_checkpoint

    levers = {**SHARDED, "cpu_offload": True, "precision": "bf16", "activation_checkpointing": True, "kl_coef": 0.05}
    config = write_train_config(tmp_path, steps=2, checkpoint_every=1, keep_checkpoints=0, optimizer=levers)
    proc = subprocess.run(cli_command("train", "--config", str(config), "--no-progress"), capture_output=True,
                          text=True, timeout=900, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [1, 2]  # one process: the engine starts on the model itself
    assert all(0 < r["grad_norm"] < float("inf") for r in rows)
    # step 2 sampled from weights synced out of the offloaded shards: the fp32 engine's logprobs are the bf16
    # trainer's up to bf16 rounding (a failed sync would leave the engine on other weights)
    assert rows[1]["logprob_diff"] < 0.05, rows[1]["logprob_diff"]
    assert all(is_sharded_checkpoint(run / "checkpoints" / name) for name in ("step_1", "step_2", "final"))
