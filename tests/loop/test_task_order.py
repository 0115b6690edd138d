"""The run's task order (`loop.task_order.TaskOrder`): a fresh seeded shuffle per epoch, each epoch a permutation,
no batch holding a task twice (across an epoch's end too), the same order for the same seed and from any resumed
position; and a step of more tasks than the data holds refused at plan time."""

from __future__ import annotations

import json

import pytest
from support.train_runs import write_train_config

from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config
from agentic_rl.loop.plan import plan_run
from agentic_rl.loop.task_order import TaskOrder


def _tasks(n: int) -> list[dict]:
    return [{"id": f"t{i}"} for i in range(n)]


def _ids(order: TaskOrder, batches: int) -> list[list[str]]:
    return [[t["id"] for t in order.next_batch()] for _ in range(batches)]


@pytest.mark.parametrize(("n", "per_step"), [(7, 3), (6, 2), (5, 5), (10, 4), (3, 1)])
def test_each_epoch_is_its_own_permutation_and_no_batch_repeats_a_task(n, per_step):
    order = TaskOrder(_tasks(n), per_step, seed=3)
    epochs = 6
    batches = _ids(order, epochs * n // per_step + 1)
    flat = [i for batch in batches for i in batch]
    per_epoch = [flat[e * n : (e + 1) * n] for e in range(epochs)]
    for epoch in per_epoch:
        assert sorted(epoch) == sorted(t["id"] for t in _tasks(n))  # every task once per epoch
    if n > 2:
        assert len({tuple(e) for e in per_epoch}) > 1  # reshuffled, not one order cycled
    for batch in batches:
        assert len(batch) == len(set(batch)) == per_step  # no step trains two groups of one task
    assert order.position == len(batches) * per_step


def test_epoch_zero_is_the_seeded_shuffle_and_the_same_seed_gives_the_same_order():
    import random

    first = TaskOrder(_tasks(9), 2, seed=11)
    expected = list(range(9))
    random.Random(11).shuffle(expected)
    assert first.order == expected  # the first epoch is the order runs always had
    assert _ids(first, 20) == _ids(TaskOrder(_tasks(9), 2, seed=11), 20)
    assert _ids(TaskOrder(_tasks(9), 2, seed=11), 20) != _ids(TaskOrder(_tasks(9), 2, seed=12), 20)


@pytest.mark.parametrize("stop", [1, 4, 5, 9])
def test_an_order_resumed_at_a_position_continues_the_same_way(stop):
    reference = _ids(TaskOrder(_tasks(7), 3, seed=5), 16)
    resumed = TaskOrder(_tasks(7), 3, seed=5)
    resumed.position = stop * 3  # what a checkpoint restores: mid-epoch and across epoch ends
    assert _ids(resumed, 16 - stop) == reference[stop:]
    assert [resumed.task_at(p)["id"] for p in range(6)] == [i for b in reference[:2] for i in b]  # re-read by position


def test_a_batch_larger_than_the_data_is_refused_by_the_order():
    with pytest.raises(ConfigError, match="4 tasks does not fit in an epoch of 3"):
        TaskOrder(_tasks(3), 4, seed=0)


@pytest.mark.parametrize(("per_rank", "world_size", "message"), [
    (4, 1, r"rollout.tasks_per_step=4 tasks per step is more than the 3 task\(s\)"),
    (2, 2, r"rollout.tasks_per_step=2 x 2 ranks = 4 tasks per step is more than the 3 task\(s\)"),
])  # fmt: skip
def test_a_step_of_more_tasks_than_the_data_is_refused_at_plan_time(tmp_path, per_rank, world_size, message):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": "1+1?", "answer": "2"}) + "\n" for i in range(3)))
    config = load_train_config(write_train_config(tmp_path), [f"data={data}", f"rollout.tasks_per_step={per_rank}"])
    with pytest.raises(ConfigError, match=message) as caught:
        plan_run(config, rank=0, world_size=world_size, state=None)
    assert str(data) in str(caught.value)
    plan_run(config.model_copy(update={"rollout": config.rollout.model_copy(update={"tasks_per_step": 3})}), 0, 1, None)
