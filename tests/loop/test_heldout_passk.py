"""A training run's held-out evaluation with K samples per task (`eval_samples`): pass@k, avg@K and the standard error
of the held-out accuracy, over every rank's tasks, checked against the run's own eval records."""

from __future__ import annotations

import json
import math
import statistics
import subprocess

import pytest
from support.processes import ROOT, cli_command, cli_env
from support.train_runs import write_train_config

from agentic_rl.errors import ConfigError


def test_several_samples_per_task_need_a_sampled_evaluation(tmp_path):
    from agentic_rl.loop import load_train_config

    path = write_train_config(tmp_path, eval_data="arithmetic:heldout:4", eval_samples=3)
    with pytest.raises(ConfigError, match=r"eval_samples=3.*eval_temperature"):
        load_train_config(path)
    assert load_train_config(path, ["eval_temperature=1.0"]).eval_samples == 3
    assert load_train_config(path, ["eval_samples=1"]).eval_samples == 1  # greedy with one sample: as before
    with pytest.raises(ConfigError, match="eval_samples"):
        load_train_config(path, ["eval_samples=0", "eval_temperature=1.0"])


class _Recording:
    """A single rank that keeps what it gathered."""

    world_size, rank, is_main = 1, 0, True

    def gather_floats(self, values):
        self.values = list(values)
        return [self.values]


class _TwoRanks(_Recording):
    """Rank 0 of two: the other rank's gathered values are given."""

    world_size = 2

    def __init__(self, other):
        self.other = other

    def gather_floats(self, values):
        return [list(values), self.other]


def test_pass_figures_are_over_the_tasks_of_every_rank():
    from agentic_rl.loop.metrics import heldout_pass_figures

    tasks = [[True, False, False], [False, False, False], [True, True, False], [True, True, True], [False, True, False]]
    whole = heldout_pass_figures(_Recording(), tasks, 3)
    second = _Recording()
    heldout_pass_figures(second, tasks[3:], 3)
    assert heldout_pass_figures(_TwoRanks(second.values), tasks[:3], 3) == pytest.approx(whole)
    assert heldout_pass_figures(_TwoRanks(second.values), [], 3) == pytest.approx(
        heldout_pass_figures(_Recording(), tasks[3:], 3)
    )  # a rank that evaluated nothing (a tensor-parallel follower) adds nothing
    shares = [sum(t) / 3 for t in tasks]
    assert whole["heldout_avg@K"] == pytest.approx(statistics.mean(shares))
    assert whole["heldout_accuracy_stderr"] == pytest.approx(statistics.stdev(shares) / math.sqrt(len(tasks)))
    assert whole["heldout_pass@1"] == pytest.approx(whole["heldout_avg@K"])
    assert whole["heldout_pass@3"] == pytest.approx(4 / 5)  # tasks with any correct sample
    assert heldout_pass_figures(_Recording(), tasks[:1], 3)["heldout_accuracy_stderr"] is None  # one task: undefined


def test_a_metrics_standard_error_takes_the_task_as_its_unit_over_every_rank():
    from types import SimpleNamespace

    from agentic_rl.loop.rewards import task_stderr_figures

    f1 = [[0.0, 0.5], [1.0, 1.0], [0.2, None], [0.0, 0.0], [None, None]]  # None: the metric was not recorded
    trajectories = [SimpleNamespace(metrics={} if v is None else {"hotpotqa_f1": v, "judge_calls": 1})
                    for task in f1 for v in task]  # fmt: skip
    keys = ["judge_calls", "hotpotqa_f1"]
    whole = task_stderr_figures(_Recording(), trajectories, keys, 2)
    means = [0.25, 1.0, 0.2, 0.0]  # the last task recorded nothing
    assert whole == {"heldout_hotpotqa_f1_stderr": pytest.approx(statistics.stdev(means) / math.sqrt(4))}
    second = _Recording()
    task_stderr_figures(second, trajectories[6:], keys, 2)
    assert task_stderr_figures(_TwoRanks(second.values), trajectories[:6], keys, 2) == pytest.approx(whole)
    assert task_stderr_figures(_Recording(), trajectories[:2], keys, 2) == {"heldout_hotpotqa_f1_stderr": None}


def test_eval_samples_keep_their_seeds_at_every_evaluation(tmp_path):
    from agentic_rl.engine.sampling import derive_seed
    from agentic_rl.loop import load_train_config
    from agentic_rl.loop.setup import step_sampling

    config = load_train_config(write_train_config(tmp_path, eval_data="arithmetic:heldout:4", eval_samples=3,
                                                  eval_temperature=1.0, seed=7))  # fmt: skip
    sampling = step_sampling(config, 0, None)
    assert sampling.seed == step_sampling(config, 0, None).seed == derive_seed(7, step=-1)
    assert sampling.temperature == 1.0
    assert len({derive_seed(sampling.seed, trajectory=i) for i in range(4 * 3)}) == 12  # each sample its own


def _pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.slow
def test_a_run_logs_heldout_pass_at_k_of_its_own_eval_records(tmp_path):
    k, tasks = 3, 4
    path = write_train_config(tmp_path, steps=1, reward="support.toy_rewards:e_count_odd",
                              eval_data="arithmetic:heldout:6", eval_limit=tasks, eval_samples=k, eval_temperature=1.0)  # fmt: skip
    proc = subprocess.run(cli_command("train", "--config", str(path), "--no-progress"), capture_output=True,
                          text=True, timeout=600, env=cli_env(), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluations = {0: rows[0], 1: rows[1]}  # before the first step, and after the last
    for step, row in evaluations.items():
        records = [json.loads(line) for line in (run / f"rollouts/eval_step_{step}.jsonl").read_text().splitlines()]
        assert len(records) == tasks * k
        by_task = [records[i : i + k] for i in range(0, len(records), k)]  # task-major: K samples of each task
        for samples in by_task:
            assert len({r["task_id"] for r in samples}) == 1
        correct = [sum((r["metrics"] or {}).get("res_reward", 0.0) > 0 for r in samples) for samples in by_task]
        for j in range(1, k + 1):
            expected = sum(_pass_at_k(k, c, j) for c in correct) / tasks
            assert row[f"heldout_pass@{j}"] == pytest.approx(expected, abs=1e-12), (step, j)
        assert [row[f"heldout_pass@{j}"] for j in range(1, k + 1)] == sorted(row[f"heldout_pass@{j}"] for j in range(1, k + 1))
        shares = [c / k for c in correct]
        assert row["heldout_avg@K"] == pytest.approx(statistics.mean(shares))
        assert row["heldout_accuracy"] == pytest.approx(statistics.mean(shares))
        assert row["heldout_accuracy_stderr"] == pytest.approx(statistics.stdev(shares) / math.sqrt(tasks))
        assert f"heldout_pass@{k + 1}" not in row
