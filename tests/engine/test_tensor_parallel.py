"""A tensor-parallel engine over two gloo ranks (`agentic_rl.engine.tensor_parallel`): the same tokens and logprobs
as one process, before and after a weight sync; requests refused alike; a dead or stopped shard stops its leader
with an error naming it."""

import json
import os
import subprocess
import sys

import pytest
from support.launch import ROOT, run_gloo_ranks, start_gloo_ranks

SCRIPT = str(ROOT / "tests" / "engine" / "tp_ranks.py")


@pytest.fixture(scope="module")
def tiny_dir():
    from agentic_rl.models import resolve_model

    return str(resolve_model("tiny-random-smollm2"))  # 2 attention heads: it splits over 2 ranks


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    """What a TP=2 group (2 gloo ranks) and one plain engine saw, from the same prompts and weights."""
    tp, solo = tmp_path_factory.mktemp("tp2"), tmp_path_factory.mktemp("tp1")
    run_gloo_ranks([SCRIPT, tiny_dir, str(tp), "2"], timeout_s=600, world=2)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, SCRIPT, tiny_dir, str(solo)], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    read = lambda folder, rank: json.loads((folder / f"rank{rank}.json").read_text())  # noqa: E731
    return read(tp, 0), read(tp, 1), read(solo, 0)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_tp2_engine_samples_what_one_process_samples(runs, when):
    leader, _, solo = runs
    assert len(leader[when]) == len(solo[when]) == 32
    for mine, theirs in zip(leader[when], solo[when], strict=True):
        assert mine["tokens"] == theirs["tokens"]
        assert max(abs(a - b) for a, b in zip(mine["logprobs"], theirs["logprobs"], strict=True)) <= 1e-5
        assert set(mine["versions"]) == {0 if when == "before" else 1}


def test_every_shard_takes_the_weight_sync(runs):
    leader, follower, solo = runs
    assert leader["version"] == follower["version"] == solo["version"] == 1
    assert leader["sync"] and follower["sync"]  # each shard loaded the full tensors itself


def test_a_request_refused_by_the_engine_leaves_the_group_in_step(runs):
    leader, _, solo = runs
    assert leader["refused"] == solo["refused"] == "EngineRejectedError"
    assert leader["after_resume"] == solo["after_resume"]  # sampled after the refusal, pause and resume
    assert leader["paused_done"] is False  # nothing sampled while paused


def test_a_follower_refuses_to_sample(runs):
    _, follower, _ = runs
    assert "only its leader (rank 0)" in follower["follower_refused"]


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_dead_or_stalled_shard_stops_its_leader_naming_it(tiny_dir, tmp_path, fault):
    procs = start_gloo_ranks([SCRIPT, tiny_dir, str(tmp_path), "2", fault], world=2)
    try:
        _, err = procs[0].communicate(timeout=300)  # the group times out in 10 s
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 75, err[-3000:]
    why = [line for line in err.splitlines() if line.startswith("agentic_rl: tensor-parallel engine group 0")]
    assert why and "rank 1" in why[0] and ("died" in why[0] or "no sign of life" in why[0]), err[-3000:]
