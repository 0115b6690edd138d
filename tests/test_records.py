"""The `trajectories.jsonl` records (`agentic_rl.records`): a trajectory written and read back, and continuing a
rollout from them: the half-written last line, which tasks are done, and running the rest with their original
indices (no engine needed)."""

from __future__ import annotations

import json

import anyio
import pytest

from agentic_rl.data import drop_partial_line
from agentic_rl.errors import ConfigError, TrajectoryError
from agentic_rl.records import finished_records, trajectory_from_dict, trajectory_to_dict, write_trajectories
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.types import StepTrajectory, Trajectory

TASKS = [{"id": f"t{i}", "question": "q", "ground_truth": "1"} for i in range(4)]


def record(idx: int, task_id: object = None) -> str:
    t = StepTrajectory(
        prompt_tokens=[1, 2],
        response_tokens=[3, 4, 5],
        response_masks=[1, 0, 1],
        idx=idx,
        response_logprobs=[-0.5, 0.0, -1.5],
        trajectory_reward=0.5,
        termination_reason="env_done",
        task={"id": f"t{idx}" if task_id is None else task_id},
    )
    return json.dumps(trajectory_to_dict(t)) + "\n"


def test_drop_partial_line_cuts_back_to_the_last_newline(tmp_path):
    path = tmp_path / "r.jsonl"
    assert drop_partial_line(path) == 0 and not path.exists()  # nothing written yet: left missing
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    assert drop_partial_line(path) == 0 and path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": [1, 2')
    assert drop_partial_line(path) == len(b'{"c": [1, 2')
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    path.write_bytes(b'{"only": "half' + b"x" * 200_000)  # no newline at all, longer than one scan block
    assert drop_partial_line(path) == 200_014 and path.read_bytes() == b""


def test_finished_records_by_index_after_a_half_line(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    assert finished_records(path, TASKS) == {}
    path.write_text(record(2) + record(0) + record(3)[:40])
    done = finished_records(path, TASKS)
    assert sorted(done) == [0, 2] and done[2]["task_id"] == "t2"
    assert path.read_text() == record(2) + record(0)  # the half line is gone from the file too


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([record(1, task_id="other")], "task id 'other', but the task file has 't1' there"),
        ([record(1), record(1)], "a second record of task 1"),
        ([record(9)], "idx 9 is outside the 4 tasks"),
        (['{"no": "idx"}\n'], "no integer 'idx'"),
        (["not json\n"], "not valid JSON"),
    ],
)
def test_finished_records_rejects_records_that_do_not_belong_to_the_tasks(tmp_path, lines, message):
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(lines))
    with pytest.raises(ConfigError, match=message):
        finished_records(path, TASKS)


def test_trajectory_from_dict_restores_what_the_summary_needs():
    row = json.loads(record(3))
    t = trajectory_from_dict(row)
    assert (t.idx, t.num_generated_tokens, t.trajectory_reward, t.termination_reason) == (3, 2, 0.5, "env_done")
    assert t.response_logprobs.tolist() == [-0.5, 0.0, -1.5]
    with pytest.raises(TrajectoryError, match="'prompt_ids'"):
        trajectory_from_dict({k: v for k, v in row.items() if k != "prompt_ids"})


def test_write_trajectories_writes_one_record_per_line_with_its_task_id(tmp_path):
    path = tmp_path / "step_1.jsonl"
    plain = Trajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], idx=1)
    write_trajectories(path, [json_trajectory(0), plain], task_ids=["ignored", "t1"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["task_id"] for row in rows] == ["t0", "t1"]  # a record's own task id wins over task_ids
    assert trajectory_from_dict(rows[1]).response_tokens.tolist() == [2]
    write_trajectories(path, [plain])  # overwrites, and no task_id without task_ids
    assert "task_id" not in json.loads(path.read_text())


def json_trajectory(idx: int) -> StepTrajectory:
    return StepTrajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], idx=idx, task={"id": f"t{idx}"})


def test_run_tasks_keeps_given_indices():
    seen = []

    async def one(task, idx):
        seen.append(idx)
        return (task, idx)

    async def main():
        out = await run_tasks(["c", "a"], one, n_parallel_agents=2, indices=[5, 2])
        assert out == [("c", 5), ("a", 2)]  # input order, each with its own index
        with pytest.raises(ConfigError, match="one distinct index per task"):
            await run_tasks(["a", "b"], one, n_parallel_agents=1, indices=[1, 1])

    anyio.run(main)
    assert sorted(seen) == [2, 5]


def test_read_trajectories_reads_back_what_was_written_and_leaves_a_half_line_alone(tmp_path):
    from agentic_rl.records import read_trajectories
    from agentic_rl.types import TerminationReason

    written = [
        Trajectory(prompt_tokens=[1], response_tokens=[2, 3], response_masks=[1, 1], idx=i, trajectory_reward=r,
                   response_logprobs=[-0.1, -0.2], termination_reason="max_steps", refused=refused)
        for i, (r, refused) in enumerate([(1.0, None), (0.0, "stale: sampled 3 versions ago")])
    ]  # fmt: skip
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, written)
    with path.open("a") as f:
        f.write('{"idx": 2, "prompt_ids": [1')  # a process killed mid-write
    before = path.read_bytes()
    read = read_trajectories(path)
    assert path.read_bytes() == before  # only read
    assert [t.idx for t in read] == [0, 1] and [t.trajectory_reward for t in read] == [1.0, 0.0]
    assert [t.refused for t in read] == [None, "stale: sampled 3 versions ago"]
    assert read[0].termination_reason is TerminationReason.MAX_STEPS
    assert [t.response_tokens.tolist() for t in read] == [[2, 3], [2, 3]]


def test_read_trajectories_names_the_line_that_is_not_a_record(tmp_path):
    from agentic_rl.records import read_trajectories

    path = tmp_path / "trajectories.jsonl"
    path.write_text(record(0) + "[1, 2]\n")
    with pytest.raises(ConfigError, match=r"trajectories.jsonl:2: not a trajectory record"):
        read_trajectories(path)
    path.write_text(record(0) + '{"idx": 1}\n')
    with pytest.raises(ConfigError, match=r"trajectories.jsonl:2: not a trajectory record: .*needs 'prompt_ids'"):
        read_trajectories(path)
