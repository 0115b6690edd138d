"""ContinuousRollout with dynamic sampling: idle groups (constant, or every sample overlong-filtered) are left out
and counted, failed groups are never left out, a step short of useful groups draws more tasks (at most
`max_extra_draws` times), every drawn group is trained once or counted as idle, the staleness bound holds, and a
resumed run accounts for every task once.

As in test_continuous.py the rollout sleeps for a seeded random latency and stamps each sample with the steps done
when it started (the weight version that samples it). Rewards are chosen per task: a task is constant (every sample
the same reward, or a single valid sample) or varied, drawn from a seeded generator. Assertions hold for any
interleaving.
"""

from __future__ import annotations

import logging
import random

import anyio
import pytest
import torch

from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.loop.scheduler import ContinuousRollout, PendingGroup
from agentic_rl.train.groups import TrajectoryGroup
from agentic_rl.types import Step, StepTrajectory, Trajectory

pytestmark = pytest.mark.anyio

GROUP_SIZE = 2


def _kind(task_id: int, p_constant: float) -> str:
    """How task `task_id`'s group turns out: `same` (equal rewards), `one_valid` (one sample fails), `failed` (every
    sample fails: no signal, yet never left out) or `varied`."""
    draw = random.Random(task_id).random()
    if draw >= p_constant:
        return "varied"
    return ("same", "one_valid", "failed")[min(int(3 * draw / p_constant), 2)]


class _Rollout:
    """One trajectory per sample after a seeded latency; the reward follows the task's kind (`_kind`)."""

    def __init__(self, seed: int, p_constant: float, *, failures: bool = True) -> None:
        self.rng = random.Random(seed)
        self.p_constant = p_constant
        self.failures = failures  # False: no group fails whole (its kind is then `same`)
        self.feed: ContinuousRollout | None = None
        self.handed_out: list[int] = []  # task ids, in the order `next_batch` gave them
        self.seeds: list[int] = []

    def next_batch(self, per_step: int):
        start = self.handed_out[-1] + 1 if self.handed_out else self.first_id
        batch = [{"id": start + i} for i in range(per_step)]
        self.handed_out += [t["id"] for t in batch]
        return [(t["id"], t) for t in batch]  # each task's id is its position in the order

    async def run(self, tasks, sampling, indices):
        assert self.feed is not None
        start = self.feed.steps_done
        await anyio.sleep(self.rng.lognormvariate(-6.0, 1.0))
        out = []
        for task, index in zip(tasks, indices, strict=True):
            self.seeds.append(sampling.derived(trajectory=index).seed)
            j, kind = index % GROUP_SIZE, _kind(task["id"], self.p_constant)
            kind = "same" if kind == "failed" and not self.failures else kind
            t = Trajectory(torch.tensor([1]), torch.tensor([2]), torch.tensor([1]))
            t.trajectory_reward = {"same": 1.0, "one_valid": float(j), "varied": float(j), "failed": 0.0}[kind]
            t.failed = kind == "failed" or (kind == "one_valid" and j == 0)
            t.metrics.update(task_id=task["id"], started_at=start)
            out.append(t)
        return out


def _feed(sim: _Rollout, *, k: int, steps: int, per_step: int = 3, draws: int = 2, first_step: int = 0,
          pending=(), next_batch_index=None, first_id: int = 0, dynamic: bool = True) -> ContinuousRollout:  # fmt: skip
    sim.first_id = first_id
    feed = ContinuousRollout(
        run=sim.run, next_batch=lambda: sim.next_batch(per_step), sampling=lambda batch: SamplingConfig(seed=1000 + batch),
        group_size=GROUP_SIZE, groups_per_step=per_step, max_staleness=k, n_parallel_agents=4, first_step=first_step,
        last_step=steps, pending=pending, task_at=lambda n: {"id": n}, next_batch_index=next_batch_index, dynamic_sampling=dynamic,
        max_extra_draws=draws,
    )  # fmt: skip
    sim.feed = feed
    return feed


async def _train(feed: ContinuousRollout, steps: range, *, stop_after: int | None = None):
    """Drive the feed like the training loop: [(step, trained, constant, counts, record)] and a checkpoint, with
    `handed_out`: the tasks the order had handed out when it was taken (what the loop's checkpoint records as its
    task order position; `serve` may admit another batch before it is cancelled)."""
    out, saved = [], None
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.serve)
        for step in steps:
            groups = await feed.next_step(step)
            out.append(
                (
                    step,
                    groups,
                    list(feed.constant),
                    dict(feed.step_counts),
                    feed.step_record(step, groups, lambda t: t["id"]),
                )
            )
            await anyio.sleep(0.002)  # the train step: the rollout runs on meanwhile
            feed.step_done()
            if stop_after is not None and step + 1 == stop_after:
                saved = {**feed.checkpoint(), "handed_out": list(feed.run.__self__.handed_out)}  # the `_Rollout`'s
                break
        tg.cancel_scope.cancel()
    return out, saved


def _check_step(step: int, trained: list[TrajectoryGroup], constant: list[TrajectoryGroup], counts: dict, record: dict, *, k: int,
                per_step: int, draws: int) -> None:  # fmt: skip
    """The invariants of one step."""
    fallback = not constant and all(g.idle for g in trained)  # nothing but idle groups: trained anyway
    assert counts == ({"drawn": len(trained), "kept": 0, "constant": len(trained)} if fallback else
                      {"drawn": len(trained) + len(constant), "kept": len(trained), "constant": len(constant)})  # fmt: skip
    assert record["task_ids"] == [g.task["id"] for g in trained]
    assert record["constant_task_ids"] == [g.task["id"] for g in constant]
    assert record["draws"] == [g.draw for g in trained]
    assert all(g.idle and not g.failed for g in constant)  # a failed group is never left out: it is reported
    if not fallback:
        assert not any(g.idle for g in trained)
    made = max((g.draw for g in trained + constant), default=0)
    assert made <= draws
    if sum(g.useful for g in trained) < per_step:  # short: only once every draw was made
        assert made == draws
    for g in trained + constant:
        assert g.finished and (g.draw == 0 or g.batch == step)  # an extra draw is trained in its own step
        assert g.batch - k <= g.admitted_at and g.batch >= step  # admitted within the bound, trained by its due step
        for t in g.trajectories:
            assert step - t.metrics["started_at"] <= k  # no token older than k versions


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("p_constant", [0.5, 0.9])
async def test_every_drawn_group_is_trained_once_or_counted_constant_within_the_bound(k, seed, p_constant):
    sim = _Rollout(seed, p_constant)
    steps, per_step, draws = 6, 3, 2
    out, _ = await _train(_feed(sim, k=k, steps=steps, per_step=per_step, draws=draws), range(steps))
    for step, trained, constant, counts, record in out:
        _check_step(step, trained, constant, counts, record, k=k, per_step=per_step, draws=draws)
    accounted = [g.task["id"] for _, trained, constant, _, _ in out for g in trained + constant]
    assert sorted(accounted) == sorted(sim.handed_out) == sorted(set(sim.handed_out))  # each drawn task once
    assert len(sim.seeds) == len(set(sim.seeds)) == len(sim.handed_out) * GROUP_SIZE  # no two samples share a seed
    assert len(sim.handed_out) > steps * per_step  # constant groups made steps draw more
    if k == 0:  # lockstep: nothing of batch t + 1 starts before step t is done, extra draws included
        assert all(t.metrics["started_at"] == step for step, trained, constant, _, _ in out
                   for g in trained + constant for t in g.trajectories)  # fmt: skip


async def test_without_constant_groups_dynamic_sampling_changes_nothing():
    runs = []
    for dynamic in (False, True):
        sim = _Rollout(3, p_constant=0.0)
        out, _ = await _train(_feed(sim, k=0, steps=4, dynamic=dynamic), range(4))
        runs.append(([[g.task["id"] for g in trained] for _, trained, *_ in out], sim.handed_out, sorted(sim.seeds)))
        assert all(counts == {"drawn": 3, "kept": 3, "constant": 0} for *_, counts, _ in out)
    assert runs[0] == runs[1]


async def test_a_step_of_constant_groups_only_draws_every_time_then_trains_them(caplog):
    sim = _Rollout(4, p_constant=1.0, failures=False)
    with caplog.at_level(logging.WARNING, logger="agentic_rl.loop.scheduler"):
        out, _ = await _train(_feed(sim, k=1, steps=2, per_step=2, draws=3), range(2))
    for step, trained, constant, counts, _ in out:
        assert constant == [] and all(g.idle for g in trained)
        assert counts == {"drawn": len(trained), "kept": 0, "constant": len(trained)}  # trained, but counted as idle
        assert {g.draw for g in trained if g.batch == step} >= {1, 2, 3}  # every draw made, to no avail
    assert "every group trains nothing" in caplog.text
    assert len(sim.handed_out) == len(set(sim.handed_out))


@pytest.mark.parametrize("stop_after", [1, 2, 4])
@pytest.mark.parametrize("k", [0, 2])
async def test_resume_accounts_for_every_drawn_task_once(stop_after, k):
    steps = 6
    sim = _Rollout(6, p_constant=0.6)
    first, saved = await _train(_feed(sim, k=k, steps=steps), range(steps), stop_after=stop_after)
    assert saved is not None
    assert all(p["position"] < 3 for p in saved["pending"])  # an extra draw is never pending: it is due at once
    handed_out = saved["handed_out"]  # the resumed run's order continues after it
    sim2 = _Rollout(7, p_constant=0.6)
    feed = _feed(sim2, k=k, steps=steps, first_step=stop_after, pending=[PendingGroup(**p) for p in saved["pending"]],
                 next_batch_index=saved["next_batch"], first_id=handed_out[-1] + 1)  # fmt: skip
    second, _ = await _train(feed, range(stop_after, steps))
    accounted = [g.task["id"] for _, trained, constant, _, _ in first + second for g in trained + constant]
    assert sorted(accounted) == sorted(set(handed_out + sim2.handed_out))  # each once: none lost, none twice


def test_bad_draw_bounds_are_refused():
    sim = _Rollout(0, 0.5)
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="max_extra_draws"):
            _feed(sim, k=0, steps=2, draws=bad)


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_without_extra_draws_a_step_that_earlier_steps_left_no_group_draws_once(seed):
    """k = 1: a short step takes the finished groups of the next batch; at the run's end no batch comes after, so
    the last step would have none: it draws once though `max_extra_draws` is 0 (a step needs a rollout)."""
    sim = _Rollout(seed, p_constant=1.0, failures=False)
    out, _ = await _train(_feed(sim, k=1, steps=2, per_step=2, draws=0), range(2))
    assert all(trained or constant for _, trained, constant, _, _ in out)
    accounted = [g.task["id"] for _, trained, constant, _, _ in out for g in trained + constant]
    assert sorted(accounted) == sorted(sim.handed_out)  # each once, the one draw included


async def test_no_extra_draws_leaves_idle_groups_out_and_draws_nothing():
    sim = _Rollout(5, p_constant=0.6)
    out, _ = await _train(_feed(sim, k=0, steps=4, draws=0), range(4))
    assert len(sim.handed_out) == 4 * 3  # the run's own batches only
    assert any(constant for _, _, constant, _, _ in out)  # this seed's tasks give idle groups, left out
    for step, trained, constant, counts, record in out:
        _check_step(step, trained, constant, counts, record, k=0, per_step=3, draws=0)


def _stepped(rewards: list[float], trajectory_reward: float, credited: bool = False) -> StepTrajectory:
    t = StepTrajectory(torch.tensor([1]), torch.tensor([2]), torch.tensor([1]), steps=[Step(reward=r) for r in rewards],
                       credited=credited)  # fmt: skip
    t.trajectory_reward = trajectory_reward
    return t


@pytest.mark.parametrize(
    ("samples", "trajectory_constant", "step_constant"),
    [
        # all answers wrong, but one sample reached a milestone on its first turn: a step-level signal only
        ([([0.5, 0.0, 0.0], 0.0), ([0.0, 0.0, 0.0], 0.0)], True, False),
        # the same per-turn rewards, trailing zero turns aside: every turn's return matches its siblings'
        ([([0.5, 0.0, 1.0], 1.0), ([0.5, 0.0, 1.0, 0.0], 1.0)], True, True),
        ([([0.0, 0.0, 0.0], 0.0), ([0.0], 0.0)], True, True),
        # the same total reached on different turns: the returns of turn 0 differ under a discount
        ([([0.5, 0.5], 1.0), ([1.0], 1.0)], True, False),
        ([([0.0, 1.0], 1.0), ([0.0, 0.0], 0.0)], False, False),
        # steps built outside the harness (captured): step-level training puts the trajectory's reward on the last
        ([([0.0, 0.0], 1.0), ([0.0, 0.0], 0.0)], False, False),
        # credited by the harness: a last-turn milestone and the unfinished penalty cancel, as the trainer reads it
        ([([0.0, 0.0], -0.5, True), ([0.0, 0.0], 0.0, True)], False, True),
    ],
)
def test_a_step_level_group_is_constant_only_when_its_turn_rewards_are(samples, trajectory_constant, step_constant):
    trajectories = [_stepped(*sample) for sample in samples]
    for step_level, expected in ((False, trajectory_constant), (True, step_constant)):
        group = TrajectoryGroup(0, 0, {"id": 0}, list(trajectories), admitted_at=0, step_level=step_level)
        assert group.constant is expected


def _cut(reward: float, reason: str | None) -> Trajectory:
    t = Trajectory(torch.tensor([1]), torch.tensor([2]), torch.tensor([1]))
    t.trajectory_reward, t.termination_reason = reward, reason or ""
    return t


@pytest.mark.parametrize("reasons, idle_when_filtered", [
    (("truncated", "context_limit"), True),  # rewards differ, but the filter keeps every sample out of the loss
    (("truncated", "env_done"), False),  # one sample enters the loss with a non-zero advantage
])  # fmt: skip
def test_a_group_whose_every_sample_is_overlong_filtered_is_idle_only_under_the_filter(reasons, idle_when_filtered):
    samples = [_cut(1.0, reasons[0]), _cut(0.0, reasons[1])]
    for overlong_filter in (False, True):
        group = TrajectoryGroup(0, 0, {"id": 0}, list(samples), admitted_at=0, overlong_filter=overlong_filter)
        assert not group.constant and not group.failed
        assert group.idle is (overlong_filter and idle_when_filtered)
        assert group.useful is not group.idle


def test_a_failed_group_is_neither_idle_nor_useful():
    failed = [_cut(0.0, None), _cut(0.0, None)]
    for t in failed:
        t.failed = True
    group = TrajectoryGroup(0, 0, {"id": 0}, failed, admitted_at=0)
    assert group.failed and not group.idle and not group.useful
