"""ContinuousRollout: admission under a staleness bound, due groups, completion order, exactly-once, resume.

The rollout here is a coroutine that sleeps for a seeded random latency (heavy-tailed, one task much slower than
its siblings) and stamps each sample with the number of steps done when it started, which is the weight version
that samples its tokens. Every assertion is an invariant that holds for any interleaving.
"""

from __future__ import annotations

import random

import anyio
import pytest
import torch

from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.loop.scheduler import ContinuousRollout, PendingGroup, drop_stale_groups
from agentic_rl.train.groups import TrajectoryGroup
from agentic_rl.types import TokenRun, Trajectory

pytestmark = pytest.mark.anyio


class _SimulatedRollout:
    """One trajectory per task after a latency; `metrics["version"]` = steps done when it started and ended."""

    def __init__(self, seed: int, slow_task: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.slow_task = slow_task
        self.feed: ContinuousRollout | None = None
        self.started: list[tuple[int, int]] = []  # (task id, sampling seed)
        self.in_flight = 0
        self.most_in_flight = 0

    async def run(self, tasks, sampling, indices):
        assert self.feed is not None
        out = []
        self.in_flight += len(tasks)
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for task, index in zip(tasks, indices, strict=True):
            self.started.append((task["id"], sampling.derived(trajectory=index).seed))
        start = self.feed.steps_done
        latency = self.rng.lognormvariate(-6.0, 1.0) * (10 if tasks[0]["id"] == self.slow_task else 1)
        await anyio.sleep(latency)
        for task in tasks:
            t = Trajectory(torch.tensor([1]), torch.tensor([2]), torch.tensor([1]))
            t.metrics.update(task_id=task["id"], started_at=start, ended_at=self.feed.steps_done)
            out.append(t)
        self.in_flight -= len(tasks)
        return out


def _feed(sim: _SimulatedRollout, *, k: int, steps: int, per_step: int = 3, group_size: int = 2,
          n_parallel_agents: int = 4, first_step: int = 0, pending=(), next_batch_index=None, whole_batches=False):  # fmt: skip
    counter = iter(range(next_batch_index * per_step if next_batch_index else 0, 10**6))
    feed = ContinuousRollout(
        run=sim.run, next_batch=lambda: [(n, {"id": n}) for n in (next(counter) for _ in range(per_step))],
        sampling=lambda batch: SamplingConfig(seed=1000 + batch), group_size=group_size, groups_per_step=per_step,
        max_staleness=k, n_parallel_agents=n_parallel_agents, first_step=first_step, last_step=steps,
        pending=pending, task_at=lambda n: {"id": n}, next_batch_index=next_batch_index, whole_batches=whole_batches,
    )  # fmt: skip
    sim.feed = feed
    return feed


async def _train(feed: ContinuousRollout, steps: range, *, stop_after: int | None = None):
    """Drive the feed like the training loop; returns [(step, [groups])] and the checkpoint after `stop_after`."""
    trained, saved = [], None
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.serve)
        for step in steps:
            groups = await feed.next_step(step)
            trained.append((step, groups))
            await anyio.sleep(0.002)  # the train step: the rollout runs on meanwhile
            feed.step_done()
            if stop_after is not None and step + 1 == stop_after:
                saved = feed.checkpoint()
                break
        tg.cancel_scope.cancel()
    return trained, saved


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_bound_holds_and_every_group_is_trained_once(k, seed):
    sim = _SimulatedRollout(seed, slow_task=4)  # task 4 (batch 1) is ten times slower than its siblings
    steps, per_step, group_size = 6, 3, 2
    trained, _ = await _train(_feed(sim, k=k, steps=steps, per_step=per_step, group_size=group_size), range(steps))
    ids = [g.task["id"] for _, groups in trained for g in groups]
    assert sorted(ids) == list(range(steps * per_step))  # every task of the order, exactly once: none dropped
    for step, groups in trained:
        assert len(groups) == per_step
        assert [(g.batch, g.position) for g in groups] == sorted((g.batch, g.position) for g in groups)
        for g in groups:
            assert (
                g.batch - k <= g.admitted_at and g.batch >= step
            )  # admitted within the bound, trained by its due step
            for t in g.trajectories:
                assert step - t.metrics["started_at"] <= k  # no token older than k versions
    if k == 0:  # lockstep: step t trains exactly batch t, and nothing of batch t + 1 runs before step t is done
        assert all({g.batch for g in groups} == {step} for step, groups in trained)
        assert all(t.metrics["started_at"] == step for step, groups in trained for g in groups for t in g.trajectories)
    assert sim.most_in_flight <= 4


async def test_samples_keep_their_lockstep_seeds():
    sim = _SimulatedRollout(3)
    await _train(_feed(sim, k=1, steps=3), range(3))
    lockstep = {(task_id, SamplingConfig(seed=1000 + task_id // 3).derived(trajectory=(task_id % 3) * 2 + j).seed)
                for task_id in range(9) for j in range(2)}  # fmt: skip
    assert set(sim.started) == lockstep


async def test_a_later_batch_fills_a_step_in_completion_order():
    """With k = 1 a step takes finished groups of the next batch once its own are in, in the order they finished."""
    sim = _SimulatedRollout(4)
    trained, _ = await _train(_feed(sim, k=1, steps=5), range(5))
    for step, groups in trained:
        later = [g for g in groups if g.batch > step]
        assert [g.finished_order for g in later] == sorted(g.finished_order for g in later)


async def test_whole_batches_are_one_call_each():
    sim = _SimulatedRollout(5)
    trained, _ = await _train(_feed(sim, k=1, steps=4, whole_batches=True), range(4))
    assert sorted(g.task["id"] for _, groups in trained for g in groups) == list(range(12))
    assert sim.most_in_flight <= 2 * 6  # at most k + 1 batches of 3 groups x 2 samples in flight


@pytest.mark.parametrize("stop_after", [1, 2, 4])
async def test_resume_rolls_pending_groups_out_again_exactly_once(stop_after):
    steps = 6
    sim = _SimulatedRollout(6, slow_task=2)
    first, saved = await _train(_feed(sim, k=2, steps=steps), range(steps), stop_after=stop_after)
    assert saved is not None
    pending = [PendingGroup(**p) for p in saved["pending"]]
    sim2 = _SimulatedRollout(7)
    feed = _feed(sim2, k=2, steps=steps, first_step=stop_after, pending=pending,
                 next_batch_index=saved["next_batch"])  # fmt: skip
    second, _ = await _train(feed, range(stop_after, steps))
    ids = [g.task["id"] for _, groups in first + second for g in groups]
    assert sorted(ids) == list(range(steps * 3))
    assert all(len(groups) == 3 for _, groups in first + second)


def test_bad_settings_are_refused():
    sim = _SimulatedRollout(0)
    with pytest.raises(ConfigError, match="max_staleness"):
        _feed(sim, k=-1, steps=2)
    with pytest.raises(ConfigError, match="n_parallel_agents"):
        _feed(sim, k=0, steps=2, n_parallel_agents=0)


def _sampled_at(*versions: int) -> Trajectory:
    run = TokenRun([1, 2])
    for v in versions:
        run.sample([5], [-0.1], v)
    run.insert([9])
    return Trajectory.from_runs([run])


def test_a_group_with_a_token_past_the_bound_is_dropped_visibly():
    fresh = TrajectoryGroup(3, 0, {"id": 0}, [_sampled_at(2, 3), _sampled_at(3)], admitted_at=2)
    stale = TrajectoryGroup(3, 1, {"id": 1}, [_sampled_at(1, 3), _sampled_at(3)], admitted_at=1)
    assert drop_stale_groups([fresh, stale], weight_version=3, max_staleness=1) == 1
    assert not any(t.failed for t in fresh.trajectories)
    assert all(t.failed and t.refused.startswith("stale") for t in stale.trajectories)
    assert drop_stale_groups([fresh], weight_version=4, max_staleness=2) == 0
