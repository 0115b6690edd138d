"""The order a training run takes its tasks in: `TaskOrder`, one seeded shuffle per epoch.

The order is an infinite sequence of task indices, cut into epochs of `len(tasks)` positions: epoch 0 is the
shuffle `random.Random(seed)` gives (as it always was), every later epoch a shuffle of its own, seeded by
`(seed, epoch)`. A position (`TaskOrder.position`) is a global counter into that sequence, so a resumed run that
restores it continues the same order, and a task can be re-read from its position alone (`TaskOrder.task_at`).

Batches take `per_step` consecutive positions. Each epoch holds every task once; a batch that spans the end of one
epoch and the start of the next never holds a task twice either: the next epoch's head is kept clear of the tasks of
the previous epoch's tail in that batch (by swapping them with later tasks of the epoch), so no step ever trains two
groups of one task. That needs `per_step <= len(tasks)` (`loop.plan.plan_run` refuses larger steps).
"""

from __future__ import annotations

import random
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = ["TaskOrder"]

_CACHED_EPOCHS = 4


class TaskOrder:
    """`per_step` tasks at a time from a seeded shuffle per epoch (module docstring); `position` counts the tasks
    handed out (what a resumed run restores).

    Args:
        tasks: the training tasks.
        per_step: tasks per batch (every rank's share together).
        seed: the run's seed.

    Raises:
        ConfigError: for no tasks, or `per_step` not in 1 ... `len(tasks)`.
    """

    def __init__(self, tasks: list[dict[str, Any]], per_step: int, seed: int) -> None:
        if not tasks:
            raise ConfigError("the task order needs at least one task")
        if not 1 <= per_step <= len(tasks):
            raise ConfigError(f"a batch of {per_step} tasks does not fit in an epoch of {len(tasks)} tasks")
        self.tasks = tasks
        self.per_step = per_step
        self.seed = seed
        self.position = 0
        self._epochs: dict[int, list[int]] = {}

    @property
    def order(self) -> list[int]:
        """Epoch 0's order: the task indices in the order the first epoch takes them."""
        return self.epoch_order(0)

    def next_positions(self) -> list[int]:
        """The positions of the next batch (`per_step` of them, from `position`), which they then move past."""
        positions = list(range(self.position, self.position + self.per_step))
        self.position += self.per_step
        return positions

    def next_batch(self) -> list[dict[str, Any]]:
        """The tasks of the next batch (`next_positions`)."""
        return [self.task_at(p) for p in self.next_positions()]

    def index_at(self, position: int) -> int:
        """The index in `tasks` of the task at `position` (>= 0) of the order."""
        epoch, offset = divmod(position, len(self.tasks))
        return self.epoch_order(epoch)[offset]

    def task_at(self, position: int) -> dict[str, Any]:
        """The task at `position` (>= 0) of the order (what a resumed run re-reads its pending groups by)."""
        return self.tasks[self.index_at(position)]

    def epoch_order(self, epoch: int) -> list[int]:
        """The task indices of epoch `epoch` (>= 0), in order: a permutation of `range(len(tasks))`."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch not in self._epochs:
            known = [e for e in self._epochs if e < epoch]
            done = max(known) if known else -1
            for e in range(done + 1, epoch + 1):  # each epoch's head depends on the previous epoch's tail
                self._remember(e, self._build(e))
        return self._epochs[epoch]

    def _remember(self, epoch: int, order: list[int]) -> None:
        self._epochs[epoch] = order
        while len(self._epochs) > _CACHED_EPOCHS:  # the oldest other than this one
            del self._epochs[min(e for e in self._epochs if e != epoch)]

    def _build(self, epoch: int) -> list[int]:
        """Epoch `epoch`'s order: its own seeded shuffle, its head cleared of the tasks of the batch it shares with
        the previous epoch's tail."""
        n = len(self.tasks)
        order = list(range(n))
        random.Random(self.seed if epoch == 0 else f"task order {self.seed} epoch {epoch}").shuffle(order)
        tail = (epoch * n) % self.per_step  # positions of the previous epoch in the batch spanning the boundary
        if epoch == 0 or tail == 0:
            return order
        head = self.per_step - tail
        taken = set(self.epoch_order(epoch - 1)[n - tail :])
        spare = (m for m in range(head, n) if order[m] not in taken)
        for j in range(head):
            if order[j] in taken:
                m = next(spare)  # there are n - tail >= head tasks outside `taken`
                order[j], order[m] = order[m], order[j]
        return order
