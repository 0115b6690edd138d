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

**Dynamic sampling** (`dynamic_sampling`; Yu et al. 2025, "DAPO", section 3.2): a group is *constant* when its valid
samples all have the same reward, or it has fewer than two (`TrajectoryGroup.constant`): GRPO gives it advantage 0,
so it trains nothing (only a KL term would move the weights) while it still counts in the loss's token normalizer.
With overlong filtering, a group whose every valid sample a length limit cut trains nothing either; both kinds are
*idle* (`TrajectoryGroup.idle`), and a group that is neither idle nor failed is *useful* (`TrajectoryGroup.useful`).
With dynamic sampling a step leaves its idle groups out (`constant`, counted) and, when it has fewer than
`groups_per_step` useful groups once its due groups are in, takes finished groups of later batches in completion
order until it has enough; if every admitted group has finished and it is still short, it *draws*: the next
`groups_per_step` tasks of the run's order (`next_batch`) are admitted as an extra draw of the step's own batch,
sampled now (by the current weights) with the batch's seed at positions past the batch's own, at most
`max_extra_draws` times per step. An extra draw's groups are due at once, so every one of them is trained (or left
out as idle) in that step: useful groups beyond the step's need are trained with it, never discarded or carried
over, and the staleness bound holds as without dynamic sampling (an extra draw's tokens lag 0 versions). Failed
groups are never left out: they go to the trainer, which counts them as failed, as without dynamic sampling. A step
still short after its draws trains what it has; one with nothing but idle groups trains them all (as without dynamic
sampling, still counted as idle), since a step needs a rollout, and one left with no group at all draws once, even
with `max_extra_draws` 0. Nothing is pending at a checkpoint that an extra draw admitted, so a resumed run never
rolls out or trains a drawn task twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.loop.sources import refuse
from agentic_rl.rollout.runner import check_n_parallel_agents
from agentic_rl.train.groups import TrajectoryGroup
from agentic_rl.types import Trajectory

__all__ = ["ContinuousRollout", "PendingGroup", "drop_stale_groups"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """An admitted group not trained yet, as a checkpoint keeps it (a resumed run rolls it out again).

    Only plain numbers and strings, so that a checkpoint holding it loads with `torch.load(weights_only=True)`
    whatever the task's own fields are: the task itself is re-read from the run's task order (`task_at`).

    Attributes:
        batch: the rollout batch it belongs to (its sampling seed's step, 0-based).
        position: the task's position within the batch.
        order: the task's position in the run's task order (`loop.task_order.TaskOrder.task_at`).
        task_id: the task's `id` when it is a string or an int (None otherwise): checked against the task re-read.
    """

    batch: int
    position: int
    order: int
    task_id: str | int | None = None


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
        next_batch: the tasks of the next rollout batch, each as `(order, task)` with `order` its position in the
            run's task order (called once per batch, in batch order).
        sampling: the sampling options of batch s.
        group_size: samples per task.
        groups_per_step: groups each step trains (tasks per batch).
        max_staleness: k >= 0, the most weight versions a trained token may lag the weights it updates.
        n_parallel_agents: trajectories in flight at once, over all batches.
        first_step: the first step this run trains (0, or the checkpoint's step when resuming).
        last_step: the step after the run's last (no batch past it is admitted).
        pending: groups a checkpoint left admitted but untrained: rolled out again first, with their batches.
        task_at: the task at a position of the run's task order (re-reads `pending` groups' tasks; needed with them).
        next_batch_index: the first new batch's index (a checkpoint's; None: `first_step`).
        whole_batches: call `run` once per batch (see `run`).
        dynamic_sampling: leave idle groups (`TrajectoryGroup.idle`: constant, or every sample overlong-filtered) out of
            each step and draw more tasks while a step has fewer than `groups_per_step` useful ones (see the module's
            docstring); `next_step` then returns the step's other groups and `constant` holds the ones it left out.
        max_extra_draws: with `dynamic_sampling`, the most extra draws (of `groups_per_step` tasks each) per step
            (0: leave idle groups out, draw none).
        step_level: the trainer trains turn by turn: a group is constant when its samples' per-turn rewards are
            (`TrajectoryGroup.step_level`).
        overlong_filter: the trainer filters overlong samples (`TrajectoryGroup.overlong_filter`).

    Attributes:
        constant: the idle groups the last `next_step` left out (dynamic sampling; always empty without).
        step_counts: the last step's `drawn` (groups its rollout handed it), `kept` (the others: useful or failed)
            and `constant` (its idle ones): `drawn == kept + constant`. A step with nothing but idle groups after
            its draws trains them (a step needs a rollout): then `kept` is 0 and `constant` counts them, though
            `next_step` returned them and `constant` is empty.

    Raises:
        ConfigError: for a bad `max_staleness`, `group_size`, `groups_per_step`, `n_parallel_agents` or
            `max_extra_draws`, or `pending` groups without `task_at`.
    """

    run: RunTrajectories
    next_batch: Callable[[], list[tuple[int, dict[str, Any]]]]
    sampling: Callable[[int], SamplingConfig]
    group_size: int
    groups_per_step: int
    max_staleness: int
    n_parallel_agents: int
    first_step: int = 0
    last_step: int | None = None
    pending: Sequence[PendingGroup] = ()
    task_at: Callable[[int], dict[str, Any]] | None = None
    next_batch_index: int | None = None
    whole_batches: bool = False
    dynamic_sampling: bool = False
    max_extra_draws: int = 1
    step_level: bool = False
    overlong_filter: bool = False
    groups: list[TrajectoryGroup] = field(default_factory=list, init=False)  # admitted, untrained
    constant: list[TrajectoryGroup] = field(default_factory=list, init=False)
    step_counts: dict[str, int] = field(default_factory=dict, init=False)
    steps_done: int = field(default=0, init=False)
    _finished: int = field(default=0, init=False)
    _changed: anyio.Event = field(default_factory=anyio.Event, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be an int >= 0, got {self.max_staleness!r}")
        if self.group_size < 1 or self.groups_per_step < 1:
            raise ConfigError(
                f"group_size and groups_per_step must be >= 1, got {self.group_size}, {self.groups_per_step}"
            )
        check_n_parallel_agents(self.n_parallel_agents)
        if self.pending and self.task_at is None:
            raise ConfigError("pending groups need task_at to re-read their tasks")
        if (
            isinstance(self.max_extra_draws, bool)
            or not isinstance(self.max_extra_draws, int)
            or self.max_extra_draws < 0
        ):
            raise ConfigError(f"max_extra_draws must be an int >= 0, got {self.max_extra_draws!r}")
        self._draws: dict[int, int] = {}  # step -> extra draws made for it
        self._tg: anyio.abc.TaskGroup | None = None
        self.steps_done = self.first_step
        if self.next_batch_index is None:
            self.next_batch_index = self.first_step
        self._unadmitted = len(self.pending)  # pending groups `serve` has not admitted again yet
        self._limiter = anyio.CapacityLimiter(self.n_parallel_agents)
        self._orders: dict[int, int] = {}  # id(group) -> its task's position in the run's task order

    # ---- admission ---------------------------------------------------------------------------------------------

    def _may_admit(self, batch: int) -> bool:
        """Whether batch `batch` may start: its tokens then lag the weights that train them by at most k."""
        within_run = self.last_step is None or batch < self.last_step
        return within_run and self.steps_done >= batch - self.max_staleness

    async def serve(self) -> None:
        """Admit batches as the bound allows, for as long as the caller's task group runs (cancel it to stop):
        first the checkpoint's pending groups, then new batches in order. Each sample runs in its own task."""
        async with anyio.create_task_group() as tg:
            self._tg = tg  # a step waiting to draw more tasks may now
            self._notify()
            for batch in sorted({p.batch for p in self.pending}):
                await self._wait_until(lambda b=batch: self._may_admit(b))
                again = [(p.position, p.order, self._reread(p)) for p in self.pending if p.batch == batch]
                self._unadmitted -= len(again)
                self._admit(tg, batch, again)
            while True:
                batch = self.next_batch_index
                await self._wait_until(lambda b=batch: self._may_admit(b))
                self._admit(tg, batch, [(i, order, task) for i, (order, task) in enumerate(self.next_batch())])
                self.next_batch_index += 1

    def _reread(self, pending: PendingGroup) -> dict[str, Any]:
        """A pending group's task, re-read from the run's task order.

        Raises:
            ConfigError: when the task there has another id than the checkpoint's (the data changed since).
        """
        assert self.task_at is not None
        task = self.task_at(pending.order)
        if pending.task_id is not None and _plain_id(task) != pending.task_id:
            raise ConfigError(
                f"the checkpoint's pending task at position {pending.order} of the task order has id "
                f"{pending.task_id!r}, the data's has {_plain_id(task)!r}: resume with the data the run started with"
            )
        return task

    def _admit(
        self, tg: anyio.abc.TaskGroup, batch: int, tasks: list[tuple[int, int, dict[str, Any]]], draw: int = 0
    ) -> None:
        """Admit `(position, order, task)` groups of `batch` (extra draw `draw`) and start their samples."""
        groups = [
            TrajectoryGroup(
                batch,
                position,
                task,
                [None] * self.group_size,
                admitted_at=self.steps_done,
                draw=draw,
                step_level=self.step_level,
                overlong_filter=self.overlong_filter,
            )
            for position, _, task in tasks
        ]
        self._orders.update((id(group), order) for group, (_, order, _) in zip(groups, tasks, strict=True))
        self.groups.extend(groups)
        if self.whole_batches:
            tg.start_soon(self._sample_batch, batch, groups)
        else:
            for group in groups:
                for j in range(self.group_size):
                    tg.start_soon(self._sample, group, j)
        logger.debug("rollout batch %d admitted after %d steps (%d groups)", batch, self.steps_done, len(tasks))
        self._notify()

    async def _sample(self, group: TrajectoryGroup, j: int) -> None:
        """Roll out sample j of `group` (one of at most `n_parallel_agents` in flight)."""
        async with self._limiter:
            index = group.position * self.group_size + j  # its place in a lockstep batch: the same seed
            (trajectory,) = await self.run([dict(group.task)], self.sampling(group.batch), [index])
        self._store(group, j, trajectory)

    async def _sample_batch(self, batch: int, groups: list[TrajectoryGroup]) -> None:
        """Roll out every sample of a batch's groups in one `run` call."""
        slots = [(group, j) for group in groups for j in range(self.group_size)]
        tasks = [dict(group.task) for group, _ in slots]
        indices = [group.position * self.group_size + j for group, j in slots]
        for (group, j), trajectory in zip(slots, await self.run(tasks, self.sampling(batch), indices), strict=True):
            self._store(group, j, trajectory)

    def _store(self, group: TrajectoryGroup, j: int, trajectory: Trajectory) -> None:
        group.trajectories[j] = trajectory
        if all(t is not None for t in group.trajectories):
            group.finished_order = self._finished
            self._finished += 1
            self._notify()

    # ---- steps -------------------------------------------------------------------------------------------------

    async def next_step(self, step: int) -> list[TrajectoryGroup]:
        """The groups step `step` trains, once they are all finished, in (batch, position) order: every untrained
        group of batches <= `step` (waited for), then finished groups of later batches in the order they finished,
        `groups_per_step` in all (fewer only when the run admits no more). With `dynamic_sampling`, its groups
        that are not idle: `groups_per_step` useful ones when it can (see the module's docstring) and any failed
        ones; the idle ones are set aside in `constant`."""
        while (chosen := self._ready(step)) is None:
            if self._wants_draw(step):
                self._draw(step)
            else:
                await self._changed.wait()
        taken = {id(g) for g in chosen}
        self.groups = [g for g in self.groups if id(g) not in taken]
        for key in taken:
            self._orders.pop(key, None)
        chosen.sort(key=lambda g: (g.batch, g.position))
        self.constant = [g for g in chosen if g.idle] if self.dynamic_sampling else []
        kept = [g for g in chosen if not g.idle] if self.dynamic_sampling else chosen
        self.step_counts = {"drawn": len(chosen), "kept": len(kept), "constant": len(self.constant)}
        if self.constant and not kept:  # nothing else left after the draws: a step needs a rollout
            logger.warning(
                "step %d: every group trains nothing after %d extra draw(s): training them anyway (advantage 0)",
                step + 1,
                self._draws.get(step, 0),
            )
            kept, self.constant = self.constant, []
        self._draws.pop(step, None)
        return kept

    def _ready(self, step: int) -> list[TrajectoryGroup] | None:
        due = [g for g in self.groups if g.batch <= step]
        if not all(g.finished for g in due):
            return None
        extra = sorted((g for g in self.groups if g.batch > step and g.finished), key=lambda g: g.finished_order)
        if not self.dynamic_sampling:
            chosen = due + extra[: max(self.groups_per_step - len(due), 0)]
            if len(chosen) < self.groups_per_step and not self._admits_no_more():
                return None
            return chosen
        chosen = self._fill(due, extra)
        if sum(g.useful for g in chosen) >= self.groups_per_step:
            return chosen
        # short of useful groups: wait for what is admitted or may be, then draw while draws are left
        return chosen if self._quiet() and self._draws.get(step, 0) >= self._draw_limit() else None

    def _fill(self, due: list[TrajectoryGroup], extra: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """`due`, then groups of `extra` in order until `groups_per_step` of all are useful."""
        chosen, useful = list(due), sum(g.useful for g in due)
        for group in extra:
            if useful >= self.groups_per_step:
                break
            chosen.append(group)
            useful += group.useful
        return chosen

    def _quiet(self) -> bool:
        """Every admitted group has finished and `serve` may admit nothing more now: waiting brings no group."""
        admissible = self._unadmitted or self._may_admit(self.next_batch_index)
        return not admissible and all(g.finished for g in self.groups)

    def _wants_draw(self, step: int) -> bool:
        """Dynamic sampling: step `step` is short of useful groups with nothing left to wait for, and may
        draw again."""
        return (
            self.dynamic_sampling
            and self._tg is not None
            and self._quiet()
            and self._draws.get(step, 0) < self._draw_limit()
        )

    def _draw_limit(self) -> int:
        """The extra draws a quiet step may make: `max_extra_draws`, but at least one when no group is left at all
        (with max_staleness > 0 an earlier short step can take every later group near the run's end, and a step
        needs a rollout)."""
        return self.max_extra_draws if self.max_extra_draws or self.groups else 1

    def _draw(self, step: int) -> None:
        """Admit the next `groups_per_step` tasks of the run's order as extra draw d of batch `step` (positions
        d * groups_per_step ...: the batch's seed, offsets past its own samples)."""
        assert self._tg is not None
        d = self._draws[step] = self._draws.get(step, 0) + 1
        tasks = [(d * self.groups_per_step + i, order, task) for i, (order, task) in enumerate(self.next_batch())]
        logger.info(
            "step %d: fewer than %d useful groups: extra draw %d of %d tasks",
            step + 1,
            self.groups_per_step,
            d,
            len(tasks),
        )
        self._admit(self._tg, step, tasks, draw=d)

    def step_record(
        self, step: int, groups: Sequence[TrajectoryGroup], task_id: Callable[[Any], Any]
    ) -> dict[str, Any]:
        """The task ids file's line of step `step` (0-based) that trained `groups` (`next_step`'s): `{"step",
        "task_ids"}`, and with dynamic sampling `constant_task_ids` (the idle groups it left out) and `draws`
        (each trained group's `TrajectoryGroup.draw`), so that every drawn task is accounted for once."""
        record: dict[str, Any] = {"step": step + 1, "task_ids": [task_id(g.task) for g in groups]}
        if self.dynamic_sampling:
            record["constant_task_ids"] = [task_id(g.task) for g in self.constant]
            record["draws"] = [g.draw for g in groups]
        return record

    def _admits_no_more(self) -> bool:
        """Everything the run will admit is admitted and finished (its last steps may then be short)."""
        return (
            self.last_step is not None
            and self.next_batch_index >= self.last_step
            and not self._unadmitted
            and all(g.finished for g in self.groups)
        )

    def step_done(self) -> None:
        """The step's new weights are in the engine: batches the bound held back may start."""
        self.steps_done += 1
        self._notify()

    def checkpoint(self) -> dict[str, Any]:
        """What a resumed run needs (`ContinuousRollout(pending=..., next_batch_index=...)`): the next new batch and
        every admitted group not trained yet (running or finished, as `PendingGroup` fields: plain numbers and
        strings, never the task itself). A resumed run rolls those out again, so that none is lost and none is
        trained twice."""
        ordered = sorted(self.groups, key=lambda g: (g.batch, g.position))
        pending = [
            {"batch": g.batch, "position": g.position, "order": self._orders[id(g)], "task_id": _plain_id(g.task)}
            for g in ordered
        ]
        return {"next_batch": self.next_batch_index, "pending": pending}

    # ---- waiting -----------------------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()


def _plain_id(task: Any) -> str | int | None:
    """`task`'s `id` when it is a string or an int (what a checkpoint may hold), else None."""
    task_id = task.get("id") if isinstance(task, dict) else None
    return task_id if isinstance(task_id, str | int) and not isinstance(task_id, bool) else None


def drop_stale_groups(groups: Sequence[TrajectoryGroup], weight_version: int, max_staleness: int) -> int:
    """Refuse, in place, every group holding a sampled token more than `max_staleness` versions older than
    `weight_version` (the weights the step updates): each of its trajectories not failed yet is refused (`refuse`),
    so none of its tokens is trained (`tokens_excluded_refused`). Admission and due groups
    make this impossible for the built-in rollout; it guards the bound against a rollout that samples outside it
    (say, an agent that reuses tokens of an earlier call). Tokens whose version is not recorded are not judged.

    Returns:
        How many groups were dropped (`groups_dropped_stale`).
    """
    dropped = 0
    for group in groups:
        oldest = min(
            (
                v
                for t in group.trajectories
                if t is not None
                for run in t.token_runs()
                for v, m in zip(run.weight_versions or (), run.response_mask, strict=False)
                if m and v >= 0
            ),
            default=None,
        )
        if oldest is None or weight_version - oldest <= max_staleness:
            continue
        dropped += 1
        reason = (
            f"stale: a token sampled by weight version {oldest} is more than max_staleness={max_staleness} "
            f"versions older than the weights it would update ({weight_version})"
        )
        for t in group.samples:
            if not t.failed:
                refuse(t, reason)
        logger.warning("group of task position %d (batch %d) dropped: %s", group.position, group.batch, reason)
    return dropped
