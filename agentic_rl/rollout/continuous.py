"""Continuous rollout for bounded-staleness training: trajectories stay in flight across training steps.

The trainer takes steps of `groups_per_step` complete groups (all `group_size` samples of a task finished). Tasks
come in rollout batches of `groups_per_step` tasks, batch s being the tasks lockstep training would roll out for
step s (0-based), sampled with step s's seed. With a staleness bound k (`max_staleness`):

- **Admission**: batch s starts only once `steps_done >= s - k` (the weights have had s - k updates), so each of
  its tokens is sampled by weights of version >= s - k (counted from the run's start).
- **Due groups**: step t trains every untrained group of batches <= t, waiting for those still running, then
  fills up to `groups_per_step` with finished groups of later batches in completion order. A token of batch s is
  thus trained at step t <= s by weights of version t: at most k versions newer than the ones that sampled it.
  At most `groups_per_step` groups are ever due at once (admission lets (t + k + 1) batches in by step t, and t
  steps took t batches' worth), so a step never has more than it can train; a slow task is waited for only when
  it is due, never dropped or re-queued, so hard problems are not starved.
- With k = 0 this is lockstep training: batch t is admitted after step t - 1 and step t trains exactly it.

Within a step, groups are ordered by (batch, position), so the packing order is the task order. This module knows
nothing of the trainer: the caller reports each finished step (`step_done`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.rollout.runner import check_n_parallel_agents
from agentic_rl.types import Trajectory

__all__ = ["ContinuousRollout", "Group", "PendingGroup", "drop_stale_groups"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """An admitted group not trained yet, as a checkpoint keeps it (a resumed run rolls it out again).

    Attributes:
        batch: the rollout batch it belongs to (its sampling seed's step, 0-based).
        position: the task's position within the batch.
        task: the task.
    """

    batch: int
    position: int
    task: dict[str, Any]


@dataclass(slots=True)
class Group:
    """The `group_size` samples of one task.

    Attributes:
        batch, position, task: as in `PendingGroup`.
        trajectories: one slot per sample (index j is sample j), None until it finished.
        admitted_at: `steps_done` when its batch was admitted.
        finished_order: its rank among finished groups (0 = first to finish); -1 while running.
    """

    batch: int
    position: int
    task: dict[str, Any]
    trajectories: list[Trajectory | None]
    admitted_at: int
    finished_order: int = -1

    @property
    def finished(self) -> bool:
        return self.finished_order >= 0

    @property
    def failed(self) -> bool:
        """Every sample failed: nothing of it can be trained."""
        return all(t is not None and t.failed for t in self.trajectories)


RunTrajectories = Callable[[Sequence[dict[str, Any]], SamplingConfig, Sequence[int]], Any]


@dataclass
class ContinuousRollout:
    """Admits rollout batches under a staleness bound and hands out complete groups step by step.

    Run `serve()` in a task group for the whole training run; call `next_step(t)` for each step t in order and
    `step_done()` once that step's new weights are in the engine.

    Args:
        run: `run(tasks, sampling, indices)` rolls out one trajectory per task and returns them in order (a
            `TrainingRollout.run`); `indices` are the samples' positions in their batch (which offset their
            sampling seeds, as in a lockstep batch). It is called with one sample at a time (at most
            `n_parallel_agents` in flight), or with `whole_batches` once per batch with all its samples (for a
            rollout that runs its own concurrency: the batch's groups then finish together).
        next_batch: the tasks of the next rollout batch (called once per batch, in batch order).
        sampling: the sampling options of batch s.
        group_size: samples per task.
        groups_per_step: groups each step trains (tasks per batch).
        max_staleness: k >= 0, the most weight versions a trained token may lag the weights it updates.
        n_parallel_agents: trajectories in flight at once, over all batches.
        first_step: the first step this run trains (0, or the checkpoint's step when resuming).
        last_step: the step after the run's last (no batch past it is admitted).
        pending: groups a checkpoint left admitted but untrained: rolled out again first, with their batches.
        next_batch_index: the first new batch's index (a checkpoint's; None: `first_step`).
        whole_batches: call `run` once per batch (see `run`).

    Raises:
        ConfigError: for a bad `max_staleness`, `group_size`, `groups_per_step` or `n_parallel_agents`.
    """

    run: RunTrajectories
    next_batch: Callable[[], list[dict[str, Any]]]
    sampling: Callable[[int], SamplingConfig]
    group_size: int
    groups_per_step: int
    max_staleness: int
    n_parallel_agents: int
    first_step: int = 0
    last_step: int | None = None
    pending: Sequence[PendingGroup] = ()
    next_batch_index: int | None = None
    whole_batches: bool = False
    groups: list[Group] = field(default_factory=list, init=False)  # admitted, untrained
    steps_done: int = field(default=0, init=False)
    _finished: int = field(default=0, init=False)
    _changed: anyio.Event = field(default_factory=anyio.Event, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be an int >= 0, got {self.max_staleness!r}")
        if self.group_size < 1 or self.groups_per_step < 1:
            raise ConfigError(f"group_size and groups_per_step must be >= 1, got {self.group_size}, "
                              f"{self.groups_per_step}")  # fmt: skip
        check_n_parallel_agents(self.n_parallel_agents)
        self.steps_done = self.first_step
        if self.next_batch_index is None:
            self.next_batch_index = self.first_step
        self._unadmitted = len(self.pending)  # pending groups `serve` has not admitted again yet
        self._limiter = anyio.CapacityLimiter(self.n_parallel_agents)

    # ---- admission ---------------------------------------------------------------------------------------------

    def _may_admit(self, batch: int) -> bool:
        """Whether batch `batch` may start: its tokens then lag the weights that train them by at most k."""
        within_run = self.last_step is None or batch < self.last_step
        return within_run and self.steps_done >= batch - self.max_staleness

    async def serve(self) -> None:
        """Admit batches as the bound allows, for as long as the caller's task group runs (cancel it to stop):
        first the checkpoint's pending groups, then new batches in order. Each sample runs in its own task."""
        async with anyio.create_task_group() as tg:
            for batch in sorted({p.batch for p in self.pending}):
                await self._wait_until(lambda b=batch: self._may_admit(b))
                again = [(p.position, p.task) for p in self.pending if p.batch == batch]
                self._unadmitted -= len(again)
                self._admit(tg, batch, again)
            while True:
                batch = self.next_batch_index
                await self._wait_until(lambda b=batch: self._may_admit(b))
                self._admit(tg, batch, list(enumerate(self.next_batch())))
                self.next_batch_index += 1

    def _admit(self, tg: anyio.abc.TaskGroup, batch: int, tasks: list[tuple[int, dict[str, Any]]]) -> None:
        groups = [Group(batch, position, task, [None] * self.group_size, admitted_at=self.steps_done)
                  for position, task in tasks]  # fmt: skip
        self.groups.extend(groups)
        if self.whole_batches:
            tg.start_soon(self._sample_batch, batch, groups)
        else:
            for group in groups:
                for j in range(self.group_size):
                    tg.start_soon(self._sample, group, j)
        logger.debug("rollout batch %d admitted after %d steps (%d groups)", batch, self.steps_done, len(tasks))
        self._notify()

    async def _sample(self, group: Group, j: int) -> None:
        """Roll out sample j of `group` (one of at most `n_parallel_agents` in flight)."""
        async with self._limiter:
            index = group.position * self.group_size + j  # its place in a lockstep batch: the same seed
            (trajectory,) = await self.run([dict(group.task)], self.sampling(group.batch), [index])
        self._store(group, j, trajectory)

    async def _sample_batch(self, batch: int, groups: list[Group]) -> None:
        """Roll out every sample of a batch's groups in one `run` call."""
        slots = [(group, j) for group in groups for j in range(self.group_size)]
        tasks = [dict(group.task) for group, _ in slots]
        indices = [group.position * self.group_size + j for group, j in slots]
        for (group, j), trajectory in zip(slots, await self.run(tasks, self.sampling(batch), indices), strict=True):
            self._store(group, j, trajectory)

    def _store(self, group: Group, j: int, trajectory: Trajectory) -> None:
        group.trajectories[j] = trajectory
        if all(t is not None for t in group.trajectories):
            group.finished_order = self._finished
            self._finished += 1
            self._notify()

    # ---- steps -------------------------------------------------------------------------------------------------

    async def next_step(self, step: int) -> list[Group]:
        """The groups step `step` trains, once they are all finished, in (batch, position) order: every untrained
        group of batches <= `step` (waited for), then finished groups of later batches in the order they finished,
        `groups_per_step` in all (fewer only when the run admits no more)."""
        await self._wait_until(lambda: self._ready(step) is not None)
        chosen = self._ready(step)
        assert chosen is not None
        taken = {id(g) for g in chosen}
        self.groups = [g for g in self.groups if id(g) not in taken]
        return sorted(chosen, key=lambda g: (g.batch, g.position))

    def _ready(self, step: int) -> list[Group] | None:
        due = [g for g in self.groups if g.batch <= step]
        if not all(g.finished for g in due):
            return None
        extra = sorted((g for g in self.groups if g.batch > step and g.finished), key=lambda g: g.finished_order)
        chosen = due + extra[: max(self.groups_per_step - len(due), 0)]
        if len(chosen) < self.groups_per_step and not self._admits_no_more():
            return None
        return chosen

    def _admits_no_more(self) -> bool:
        """Everything the run will admit is admitted and finished (its last steps may then be short)."""
        return (self.last_step is not None and self.next_batch_index >= self.last_step and not self._unadmitted
                and all(g.finished for g in self.groups))  # fmt: skip

    def step_done(self) -> None:
        """The step's new weights are in the engine: batches the bound held back may start."""
        self.steps_done += 1
        self._notify()

    def checkpoint(self) -> dict[str, Any]:
        """What a resumed run needs (`ContinuousRollout(pending=..., next_batch_index=...)`): the next new batch and
        every admitted group not trained yet (running or finished, as `PendingGroup` fields). A resumed run rolls
        those out again, so that none is lost and none is trained twice."""
        ordered = sorted(self.groups, key=lambda g: (g.batch, g.position))
        return {"next_batch": self.next_batch_index,
                "pending": [{"batch": g.batch, "position": g.position, "task": g.task} for g in ordered]}  # fmt: skip

    # ---- waiting -----------------------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()


def drop_stale_groups(groups: Sequence[Group], weight_version: int, max_staleness: int) -> int:
    """Refuse, in place, every group holding a sampled token more than `max_staleness` versions older than
    `weight_version` (the weights the step updates): each of its trajectories fails with the reason in `error` and
    `metrics["refused"]`, so none of its tokens is trained (`tokens_excluded_refused`). Admission and due groups
    make this impossible for the built-in rollout; it guards the bound against a rollout that samples outside it
    (say, an agent that reuses tokens of an earlier call). Tokens whose version is not recorded are not judged.

    Returns:
        How many groups were dropped (`groups_dropped_stale`).
    """
    dropped = 0
    for group in groups:
        oldest = min((v for t in group.trajectories if t is not None for run in t.token_runs()
                      for v, m in zip(run.weight_versions or (), run.response_mask, strict=False) if m and v >= 0),
                     default=None)  # fmt: skip
        if oldest is None or weight_version - oldest <= max_staleness:
            continue
        dropped += 1
        reason = (f"stale: a token sampled by weight version {oldest} is more than max_staleness={max_staleness} "
                  f"versions older than the weights it would update ({weight_version})")  # fmt: skip
        for t in group.trajectories:
            if t is not None and not t.failed:
                t.failed, t.error = True, f"refused for training: {reason}"
                t.metrics["refused"] = reason
        logger.warning("group of task position %d (batch %d) dropped: %s", group.position, group.batch, reason)
    return dropped
