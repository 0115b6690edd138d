"""`agentic-rl train` under torchrun with `engine.tensor_parallel_size: 2` on the tiny random model (2 attention
heads), end to end: one group's leader rolls out for both ranks, each trains its share; the sync from sharded
weights keeps the engine's logprobs the trainer's; a run killed with -9 resumes onto the uninterrupted run's weights;
four ranks form two engines. And the refusals of a T that cannot be."""

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

ROOT = Path(__file__).resolve().parents[2]
TP2 = {"dtype": "float32", "kv_cache_gib": 0.1, "tensor_parallel_size": 2}


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            f"--master_port={free_port_pair()}", "-m", "agentic_rl.cli", *args, "--no-progress"]  # fmt: skip


def _rows(run: Path) -> list[list]:
    keys = ("step", "loss", "grad_norm", "reward_mean", "weight_version", "tokens_trained")
    return [[json.loads(line)[k] for k in keys] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _task_ids(run: Path, ranks: int) -> list[list[list]]:
    """Per rank, per step, the ids of the tasks it trained."""
    return [[json.loads(line)["task_ids"] for line in (run / f"task_ids_rank{r}.jsonl").read_text().splitlines()]
            for r in range(ranks)]  # fmt: skip


def _every_task_once(run: Path, ranks: int, steps: int, per_rank: int) -> None:
    ids = _task_ids(run, ranks)
    assert all(len(rank) == steps for rank in ids)
    assert all(len(step) == per_rank for rank in ids for step in rank)
    trained = [t for rank in ids for step in rank for t in step]
    assert len(trained) == len(set(trained)) == ranks * steps * per_rank  # no task twice, none lost


def _digests(run: Path, ranks: int) -> set[str]:
    return {(run / f"weights_rank{r}.sha256").read_text().strip() for r in range(ranks)}


@pytest.mark.slow
def test_one_tp2_engine_over_two_sharded_ranks_trains_and_resumes_after_a_kill(tmp_path):
    sharded = {"lr": 1.0e-3, "micro_batch_size": 2, "sharding": "fsdp"}
    whole = write_train_config(tmp_path / "whole", steps=3, checkpoint_every=1, keep_checkpoints=0, engine=TP2,
                               optimizer=sharded)  # fmt: skip
    proc = subprocess.run(_torchrun(2, "train", "--config", str(whole)), capture_output=True, text=True, timeout=900,
                          env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "whole/run"
    (digest,) = _digests(run, 2)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [2, 3, 4]  # version 1: rank 0's weights, pushed at the start
    assert all(r["grad_norm"] > 0 for r in rows)
    # each step trains tokens the TP engine sampled after a sync from the shards (fp32 on both sides)
    assert all(r["logprob_diff"] < 1e-3 for r in rows), [r["logprob_diff"] for r in rows]
    assert all(r["trajectories"] == 12 for r in rows)  # 2 ranks x 2 tasks x 3 samples
    _every_task_once(run, ranks=2, steps=3, per_rank=2)

    killed = write_train_config(tmp_path / "killed", steps=3, checkpoint_every=1, keep_checkpoints=0, engine=TP2,
                                optimizer=sharded)  # fmt: skip
    again = tmp_path / "killed/run"
    log = tmp_path / "killed.log"
    with log.open("wb") as out:  # its own session: the kill reaches the launcher and both ranks at once
        launcher = subprocess.Popen(_torchrun(2, "train", "--config", str(killed)), stdout=out,
                                    stderr=subprocess.STDOUT, env=cli_env(), cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        wait_until(launcher, lambda: (again / "checkpoints/step_1/training_state.pt").is_file(), what="step_1",
                   log=log, timeout_s=900)  # fmt: skip
    finally:
        ranks = psutil.Process(launcher.pid).children(recursive=True)
        os.killpg(launcher.pid, signal.SIGKILL)
        for p in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        launcher.wait()
        psutil.wait_procs(ranks, timeout=60)
    assert not (again / "checkpoints/final").exists()
    proc = subprocess.run(_torchrun(2, "train", "--resume", str(again)), capture_output=True, text=True,
                          timeout=900, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _digests(again, 2) == {digest}  # bit-exact: the resumed run ends on the uninterrupted run's weights
    assert _rows(again) == _rows(run)  # the same rollouts: the engine got step 1's weights at their version
    assert _task_ids(again, 2) == _task_ids(run, 2)


@pytest.mark.slow
def test_four_ranks_form_two_tp2_engines_and_train_every_task_once(tmp_path):
    config = write_train_config(tmp_path, steps=2, engine=TP2, reward="support.toy_rewards:e_share_logged")
    log = tmp_path / "rewards.log"
    proc = subprocess.run(_torchrun(4, "train", "--config", str(config)), capture_output=True, text=True,
                          timeout=900, env=cli_env(TOY_REWARD_LOG=str(log)), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    scored = [line.split("\t")[1] for line in log.read_text().splitlines()]
    assert sorted(set(scored)) == ["0", "2"]  # the leaders score; followers run no reward, tool or agent
    assert len(scored) == 2 * 4 * 2 * 3  # once per trajectory: 2 steps x 4 ranks' shares x 2 tasks x 3 samples
    assert len(_digests(run, 4)) == 1  # one model on every rank
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [2, 3]
    assert all(r["logprob_diff"] < 1e-3 and r["trajectories"] == 24 for r in rows), rows
    _every_task_once(run, ranks=4, steps=2, per_rank=2)


@pytest.mark.slow
def test_a_lora_run_syncs_its_adapter_into_every_shard_of_a_tp2_engine(tmp_path):
    lora = {"lr": 1.0e-3, "micro_batch_size": 3, "lora": {"rank": 8}}
    config = write_train_config(tmp_path, steps=2, engine=TP2, optimizer=lora)
    proc = subprocess.run(_torchrun(2, "train", "--config", str(config)), capture_output=True, text=True,
                          timeout=900, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [1, 2]  # the base, then one adapter per step
    # step 2 sampled with step 1's adapter, loaded on both shards: the trainer's logprobs (fp32 on both sides)
    assert all(r["logprob_diff"] < 1e-3 and r["trajectories"] == 12 for r in rows), rows
    _every_task_once(tmp_path / "run", ranks=2, steps=2, per_rank=2)


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["overlap", "pause"])
def test_async_runs_with_a_tp2_engine_train_within_their_staleness_and_evaluate(tmp_path, placement):
    """Bounded staleness: with `overlap` the syncs land while the leader samples (requests in flight recompute their
    KV on the new weights, in every shard); with `pause` (here with LoRA: each request pinned to its adapter) the
    engine waits. The held-out evaluation runs on the leader only and is counted once."""
    optimizer = {"lr": 1.0e-3, "micro_batch_size": 3, **({"lora": {"rank": 8}} if placement == "pause" else {})}
    data = str(ROOT.parent / "shared/data/gsm8k_train.jsonl")
    config = write_train_config(tmp_path, steps=3, engine=TP2, optimizer=optimizer, eval_data=data, eval_limit=4,
                                eval_every=3)  # fmt: skip
    written = yaml.safe_load(config.read_text())
    written["rollout"].update(max_staleness=1, placement=placement)
    config.write_text(yaml.safe_dump(written))
    proc = subprocess.run(_torchrun(2, "train", "--config", str(config)), capture_output=True, text=True,
                          timeout=900, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the held-out evaluation before training
    trained = rows[1:]
    counts = [(r["trajectories"], r["groups_dropped_stale"]) for r in trained]
    assert counts == [(12, 0)] * 3, counts
    assert trained[0]["logprob_diff"] < 1e-3  # step 1 trains what the start weights sampled, in both shards
    for row in trained:  # every token sampled at most max_staleness versions before the weights its step updated
        records = (tmp_path / f"run/rollouts/step_{row['step']}.jsonl").read_text().splitlines()
        versions = {v for r in map(json.loads, records) for v, m in zip(r["weight_versions"], r["response_mask"],
                                                                        strict=True) if m}  # fmt: skip
        assert versions and all(row["weight_version"] - 2 <= v <= row["weight_version"] - 1 for v in versions)
    evaluated = [json.loads(line) for line in (tmp_path / "run/rollouts/eval_step_3.jsonl").read_text().splitlines()]
    assert len(evaluated) == 4  # the leader's share is every held-out task: one engine
    _every_task_once(tmp_path / "run", ranks=2, steps=3, per_rank=2)
