"""Dynamic sampling and overlong filtering in a real training run on the tiny random model: constant groups are
left out and recorded, short steps draw more tasks, every drawn task is accounted for once, no trained token is
older than the staleness bound, and the tokens of trajectories cut by a length limit are counted as overlong."""

from __future__ import annotations

import json

import pytest
import yaml
from support.processes import cli_command, run
from support.train_runs import write_train_config

STEPS = 2
CUT = ("truncated", "context_limit")  # the termination reasons overlong filtering leaves out of the loss


@pytest.mark.slow
@pytest.mark.parametrize(("k", "overlong_filter"), [(1, True), (0, False)])
def test_dynamic_sampling_and_overlong_filtering_in_a_real_run(tmp_path, k, overlong_filter):
    path = write_train_config(tmp_path, steps=STEPS, reward="support.toy_rewards:e_share_or_constant")
    config = yaml.safe_load(path.read_text())
    config["rollout"].update(dynamic_sampling=True, max_extra_draws=2, max_staleness=k, toolcall_weight=0.0)
    config["optimizer"]["overlong_filter"] = overlong_filter
    path.write_text(yaml.safe_dump(config))
    run(cli_command("train", "--config", str(path), "--no-progress"))
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (run_dir / "task_ids_rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [r["step"] for r in records] == list(range(1, STEPS + 1))
    accounted = []
    for row, record in zip(rows, records, strict=True):
        print({key: row[key] for key in ("step", "groups_drawn", "groups_kept", "groups_constant", "groups_trained",
                                          "tokens_sampled", "tokens_trained", "tokens_excluded_overlong")}, record)  # fmt: skip
        trained, left_out = record["task_ids"], record["constant_task_ids"]
        assert row["groups_drawn"] == row["groups_kept"] + row["groups_constant"] == len(trained) + len(left_out) >= 2
        fallback = row["groups_kept"] == 0  # every group idle after the draws: trained anyway, counted as idle
        assert (row["groups_kept"], row["groups_constant"]) == ((0, len(trained)) if fallback else (len(trained), len(left_out)))
        assert len(record["draws"]) == len(trained) and max(record["draws"]) <= 2
        accounted += trained + left_out
        trajectories = [json.loads(line) for line in (run_dir / f"rollouts/step_{row['step']}.jsonl").read_text().splitlines()]
        assert len(trajectories) == 3 * len(trained)  # only the kept groups reach the trainer
        left_path = run_dir / f"rollouts/step_{row['step']}_left_out.jsonl"
        left = [json.loads(line) for line in left_path.read_text().splitlines()] if left_out else []
        assert left_path.exists() == bool(left_out) and sorted({t["task_id"] for t in left}) == sorted(left_out)
        assert len(left) == 3 * len(left_out)  # nothing sampled is lost: the left-out groups are written beside
        assert row["tokens_excluded_constant"] == sum(sum(t["response_mask"]) for t in left)
        if not fallback:  # a kept group is failed, or trains something: its valid rewards differ, and with the
            for task_id in trained:  # filter some valid sample was not cut
                valid = [t for t in trajectories if t["task_id"] == task_id and not t["failed"]]
                assert not valid or len({t["trajectory_reward"] for t in valid}) > 1
                assert not valid or not overlong_filter or any(t["termination_reason"] not in CUT for t in valid)
        cut = [t for t in trajectories if not t["failed"] and t["termination_reason"] in CUT]
        assert row["tokens_excluded_overlong"] == (sum(sum(t["response_mask"]) for t in cut) if overlong_filter else 0)
        assert row["tokens_sampled"] == row["tokens_trained"] + row["tokens_excluded"]
        assert sum(row[f"tokens_lag_{lag}"] for lag in range(k + 1)) == row["tokens_trained"]
        for t in trajectories:  # the bound: every sampled token at most k versions behind the weights it updates
            versions = [v for v, m in zip(t["weight_versions"], t["response_mask"], strict=True) if m]
            assert versions and all(row["step"] - 1 - k <= v <= row["step"] - 1 for v in versions)
    assert len(accounted) == len(set(accounted))  # every drawn task once: trained or left out as idle
    # with this config's seed and data a step is short of non-constant groups and draws more (the order is fixed)
    assert any(max(record["draws"]) >= 1 for record in records)
