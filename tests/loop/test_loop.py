"""`agentic-rl train` end to end on the tiny random model: one process, two torchrun ranks, and two nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.launch import free_port_pair
from support.processes import cli_env
from support.train_runs import write_train_config

from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_config_overrides_and_validation(tmp_path):
    path = write_train_config(tmp_path)
    config = load_train_config(path, ["steps=5", "rollout.group_size=8", "optimizer.lr=2e-6"])
    assert (config.steps, config.rollout.group_size, config.optimizer.lr) == (5, 8, 2e-6)
    for size in (0, 1):  # a group of one has advantage 0: it would train nothing
        with pytest.raises(ConfigError, match="rollout.group_size"):
            load_train_config(path, [f"rollout.group_size={size}"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_train_config(path, ["steps"])
    with pytest.raises(ConfigError, match="bogus"):
        load_train_config(path, ["bogus=1"])
    assert load_train_config(path, ["loggers=[jsonl, tensorboard, wandb]"]).loggers == ["jsonl", "tensorboard", "wandb"]
    assert load_train_config(path, []).loggers == ["jsonl"]
    with pytest.raises(ConfigError, match="loggers"):
        load_train_config(path, ["loggers=[mlflow]"])
    assert load_train_config(path, ["rollout.max_staleness=2"]).rollout.max_staleness == 2
    assert load_train_config(path, []).rollout.max_staleness == 0  # lockstep unless asked
    for bad in (["rollout.max_staleness=-1"], ["rollout.max_staleness=true"], ["rollout.placement=sideways"],
                ["rollout.max_staleness=1", "engine.sleep_while_training=true"]):  # fmt: skip
        with pytest.raises(ConfigError, match="max_staleness|placement"):
            load_train_config(path, bad)
    config = load_train_config(path, ["rollout.dynamic_sampling=true", "rollout.max_extra_draws=3",
                                      "optimizer.overlong_filter=true"])  # fmt: skip
    assert (config.rollout.dynamic_sampling, config.rollout.max_extra_draws, config.optimizer.overlong_filter) == (True, 3, True)
    defaults = load_train_config(path, [])
    assert (defaults.rollout.dynamic_sampling, defaults.optimizer.overlong_filter) == (False, False)  # off unless asked
    assert load_train_config(path, ["rollout.max_extra_draws=0"]).rollout.max_extra_draws == 0  # filter, no draw
    for bad in (["rollout.max_extra_draws=-1"], ["rollout.max_extra_draws=true"], ["rollout.dynamic_sampling=often"]):
        with pytest.raises(ConfigError, match="rollout.(max_extra_draws|dynamic_sampling)"):
            load_train_config(path, bad)
    for bad in (["rollout.sampling.temperature=0"], ["rollout.sampling.min_p=0.1"]):  # the trainer cannot follow them
        with pytest.raises(ConfigError, match="rollout.sampling: .*temperature > 0"):
            load_train_config(path, bad)


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("eval_data", "arithmetic:heldout:0:1", "count must be >= 1"),
    ("eval_data", "{tmp}/missing.jsonl", "No such file"),
    ("data", "{tmp}/empty.jsonl", "holds no tasks"),
])  # fmt: skip
def test_unusable_task_data_is_refused_by_field_before_the_engine_or_any_folder(tmp_path, field, value, reason):
    from agentic_rl.loop import run_training

    (tmp_path / "empty.jsonl").write_text("")
    out = tmp_path / "run"
    config = load_train_config(write_train_config(tmp_path), [f"{field}={value.format(tmp=tmp_path)}",
                                                              f"output_dir={out}"])  # fmt: skip
    with pytest.raises(ConfigError, match=rf"TrainConfig\.{field}=.*{reason}"):
        run_training(config)
    assert not out.exists()


@pytest.mark.slow
def test_single_process_training_logs_metrics_advances_weight_versions_and_checkpoints(tmp_path):
    path = write_train_config(tmp_path, loggers=["jsonl", "tensorboard", "wandb"], eval_data="arithmetic:heldout:6",
                              eval_limit=4, optimizer={"lr": 1.0e-3, "micro_batch_size": 3, "lr_schedule": "cosine",
                                                       "min_lr_ratio": 0.5})  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "agentic_rl.cli", "train", "--config", str(path), "--no-progress"],
                          capture_output=True, text=True, timeout=600, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before, rows = logged[0], logged[1:]  # a greedy held-out evaluation before the first step
    assert before["step"] == 0 and set(before) == {"step", "heldout_accuracy", "heldout_tool_call_rate",
                                                   "heldout_mean_turns"}  # fmt: skip
    assert 0.0 <= before["heldout_accuracy"] <= 1.0 and before["heldout_mean_turns"] >= 1.0
    assert "heldout_accuracy" not in rows[0] and 0.0 <= rows[-1]["heldout_accuracy"] <= 1.0  # and after the last
    assert len((run / "rollouts/eval_step_0.jsonl").read_text().splitlines()) == 4  # eval_limit of 6 tasks
    assert (run / "rollouts/eval_step_2.jsonl").is_file()
    assert [r["step"] for r in rows] == [1, 2] and [r["weight_version"] for r in rows] == [1, 2]
    for key in ("reward_mean", "reward_std", "accuracy", "loss", "kl", "grad_norm", "clip_fraction",
                "response_length", "tokens_per_s", "rollout_seconds", "train_seconds", "sync_seconds"):  # fmt: skip
        assert key in rows[0]
    assert all(r["grad_norm"] > 0 for r in rows)  # the toy reward varies inside groups
    assert [r["lr"] for r in rows] == pytest.approx([1.0e-3, 0.75e-3])  # cosine over the run's 2 steps, floor 0.5
    assert rows[0]["logprob_diff"] < 1e-3  # fp32 engine and trainer agree before the first update
    for r in rows:
        assert 0 <= r["dual_clip_fraction"] <= r["clip_fraction"] <= 1
        assert (r["step_skipped"], r["skipped_steps"]) == (0, 0)
        assert r["tokens_sampled"] == r["tokens_trained"] + r["tokens_excluded"] > 0
        reasons = ("failed", "aborted", "refused", "over_length", "overlong")
        assert r["tokens_excluded"] == sum(r[f"tokens_excluded_{k}"] for k in reasons)
        assert r["refused"] == 0  # every record of the built-in harness is what the engine sampled
        # the recorded rollout holds exactly the tokens the step accounted for (one run each: no memory here)
        record = [json.loads(line) for line in (run / f"rollouts/step_{r['step']}.jsonl").read_text().splitlines()]
        kept = [t for t in record if not t["failed"] and all(s["info"].get("finish_reason") != "abort" for s in t["steps"])]
        assert r["tokens_trained"] == sum(sum(t["response_mask"]) for t in kept)
        by_steps = [max(sum(t["response_mask"]), sum(s["info"].get("sampled_tokens", 0) for s in t["steps"])) for t in record]
        assert r["tokens_sampled"] == sum(by_steps)  # a failed record may have been dropped: its steps still count
    step2 = [json.loads(line) for line in (run / "rollouts/step_2.jsonl").read_text().splitlines()]
    assert {r["metrics"]["weight_version"] for r in step2} == {1}  # sampled after one sync
    assert (run / "checkpoints/final/model.safetensors").is_file()
    for png in ("reward_curve.png", "metrics.png", "response_lengths.png"):
        assert (run / png).read_bytes()[:4] == b"\x89PNG", png

    from support.wandb_records import history
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2]
    assert [e.step for e in events.Scalars("heldout_accuracy")] == [0, 2]
    assert [e.value for e in events.Scalars("reward_mean")] == pytest.approx([r["reward_mean"] for r in rows])
    (run_file,) = run.glob("wandb/offline-run-*/run-*.wandb")
    records = [r for r in history(run_file) if "loss" in r]
    assert [r["_step"] for r in records] == [1, 2]
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in rows])

    from agentic_rl.viewer import build_view

    page = build_view(run).read_text()  # the run's own model decodes the tokens of both steps
    assert '"source":"step 1"' in page and '"source":"step 2"' in page


def _train_command(config: Path, *launcher: str) -> list[str]:
    """`torchrun LAUNCHER... -m agentic_rl.cli train --config CONFIG`, with this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "agentic_rl.cli", "train", "--config",
            str(config), "--no-progress"]  # fmt: skip


def _run_nodes(commands: list[list[str]], logs: Path, timeout_s: float) -> None:
    """Run one launcher per node at once; fail with the logs when one fails, and kill all past `timeout_s`.

    Each launcher runs in its own session and is killed with its workers when the others fail or time runs out,
    so a rank blocked in a collective whose peer died never outlives the test.
    """
    procs = []
    try:
        for node, cmd in enumerate(commands):
            with (logs / f"node{node}.log").open("w") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cli_env(), cwd=ROOT,
                                              start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    failed = [n for n, p in enumerate(procs) if p.returncode != 0]
    tails = "\n".join(f"--- node {n}:\n{(logs / f'node{n}.log').read_text()[-3000:]}" for n in failed)
    assert not failed, f"nodes {failed} failed or timed out:\n{tails}"


def _assert_identical_moved_weights(run: Path, world: int) -> None:
    """Every rank wrote the same final weights digest, and it is not the initial model's."""
    from transformers import AutoModelForCausalLM

    from agentic_rl.loop import weights_digest
    from agentic_rl.models import resolve_model

    digests = {(run / f"weights_rank{r}.sha256").read_text().strip() for r in range(world)}
    assert len(digests) == 1, digests
    initial = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")))
    assert weights_digest(initial) not in digests  # the weights did move


@pytest.mark.slow
def test_two_torchrun_ranks_end_with_identical_weights(tmp_path):
    """Each rank builds a user's agent (examples/custom_agent.py) on its own engine; the built-in agent trains on
    two nodes below."""
    agent = {"class": "examples.custom_agent:ReflectingAgent", "kwargs": {"reward": "support.toy_rewards:e_share"}}
    path = write_train_config(tmp_path, agent=agent, reward="gsm8k")  # the agent brings its own reward
    port = free_port_pair()
    cmd = _train_command(path, "--nproc_per_node=2", f"--master_port={port}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=cli_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["trajectories"] == 2 * 2 * 3  # two ranks, each 2 tasks x 3 samples
    assert all(r["grad_norm"] > 0 and r["refused"] == 0 for r in rows)
    _assert_identical_moved_weights(run, world=2)


@pytest.mark.slow
def test_two_nodes_train_disjoint_verl_tasks_into_identical_weights(tmp_path, verl_parquet):
    """Two torchrun launchers on this machine as two nodes of one rank each, meeting through a c10d rendezvous."""
    data = verl_parquet(tmp_path / "train.parquet", n=8)
    rollout = {"tasks_per_step": 1, "group_size": 2, "n_parallel_agents": 2, "max_steps": 1, "max_prompt_length": 1024,
               "max_response_length": 16, "sampling": {"temperature": 1.0, "max_tokens": 16}}  # fmt: skip
    path = write_train_config(tmp_path, data=str(data), rollout=rollout, optimizer={"lr": 1.0e-3, "micro_batch_size": 2})
    port = free_port_pair()
    launcher = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                f"--rdzv_id=two-nodes-{port}", "--local_addr=127.0.0.1", "--max_restarts=0"]  # fmt: skip
    nodes = [_train_command(path, *launcher, f"--node_rank={n}", f"--rdzv_conf=join_timeout=300,is_host={int(n == 0)}")
             for n in (0, 1)]  # fmt: skip
    _run_nodes(nodes, tmp_path, timeout_s=600)
    run = tmp_path / "run"
    _assert_identical_moved_weights(run, world=2)
    steps = {r: [json.loads(line) for line in (run / f"task_ids_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    for r in (0, 1):
        assert [(s["step"], len(s["task_ids"])) for s in steps[r]] == [(1, 1), (2, 1)]
    ids = {r: {i for s in steps[r] for i in s["task_ids"]} for r in (0, 1)}
    assert ids[0].isdisjoint(ids[1]) and len(ids[0] | ids[1]) == 4  # four distinct verl rows (extra_info.index)
    assert ids[0] | ids[1] <= set(range(100, 108))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["trajectories"] for r in rows] == [2 * 1 * 2] * 2  # two ranks, each 1 task x 2 samples
