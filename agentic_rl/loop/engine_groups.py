"""Training with tensor-parallel engines: groups of `engine.tensor_parallel_size` ranks share one engine.

Under torchrun with `engine.tensor_parallel_size: T > 1` the ranks form groups of T consecutive ranks, each group one
tensor-parallel engine (`agentic_rl.engine.tensor_parallel`). Only a group's first rank, its leader, rolls out: its
rollout takes the group's tasks (the task order's positions sharded over the groups, T times `tasks_per_step` a
step), and once the step's task groups are in, refused and checked, it hands each rank of its group a share of
`tasks_per_step` of them (`GroupHandoff`). Every rank then trains its share as it would its own rollout's: the
trainer is the same over all ranks (replicated or sharded), its loss normalizer global (`train.distributed`), so
the step is the one of T = 1 ranks that each rolled out their share. The others (followers) serve their shard of
the engine, train and sync, and take no other part in the rollout: tools, sandboxes, rewards and the judge run
once per trajectory, on the leader.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from agentic_rl.engine.tensor_parallel import EngineGroup
from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.groups import TrajectoryGroup

__all__ = [
    "FollowerFeed",
    "GroupHandoff",
    "Share",
    "check_tensor_parallel",
    "engine_group",
    "rollout_context",
    "split_shares",
]

#: What a leader hands a rank of its group each step: its task groups, and how many of them were dropped as stale
#: and how many of their trajectories were refused (`loop.run._train_step`).
Share = tuple[list[TrajectoryGroup], int, int]


def engine_group(config: TrainConfig, dist: DistContext) -> EngineGroup | None:
    """This rank's engine group, or None with `engine.tensor_parallel_size: 1`; a rank of it that dies or stalls
    stops the others after `engine.group_timeout_s`.

    Raises:
        ConfigError: for T > 1 on one process (launch with torchrun), or a T that does not divide the ranks or
            the ranks of a node.
    """
    size = config.engine.tensor_parallel_size
    if size == 1:
        return None
    if dist.world_size == 1 or dist.store is None:
        raise ConfigError(
            f"engine.tensor_parallel_size={size} spreads one engine over {size} ranks: launch with torchrun "
            f"--nproc_per_node={size} (or a multiple of it)"
        )
    timeout_s = config.engine.group_timeout_s
    return EngineGroup.of(size, rank=dist.rank, world_size=dist.world_size, store=dist.store, timeout_s=timeout_s)


def check_tensor_parallel(config: TrainConfig, model_dir: str | Path, world_size: int) -> None:
    """Refuse an `engine.tensor_parallel_size` vLLM would refuse for the model in `model_dir`, before the trainer
    loads the model (minutes for a large one) and before any engine starts.

    Raises:
        ConfigError: naming the setting, why (the attention or key/value heads), and the sizes the run allows.
    """
    size = config.engine.tensor_parallel_size
    if size == 1:
        return
    from agentic_rl.loop.memory_plan import tensor_parallel_refusal, tensor_parallel_sizes
    from agentic_rl.loop.model_shape import ModelShape

    try:
        shape = ModelShape.load(model_dir)
    except (ConfigError, OSError, ValueError, KeyError):  # a shape the plan cannot read: vLLM's own check stays
        return
    why = tensor_parallel_refusal(shape, world_size, size)
    if why is not None:
        allowed = ", ".join(map(str, tensor_parallel_sizes(shape, world_size)))
        raise ConfigError(
            f"engine.{why}; with {world_size} ranks this model allows engine.tensor_parallel_size {allowed}"
        )


def rollout_context(dist: DistContext, group: EngineGroup | None) -> DistContext:
    """Who shares the tasks of a rollout: the ranks (T = 1), or the engine groups, numbered by `group.index`."""
    if group is None:
        return dist
    return DistContext(rank=group.index, world_size=dist.world_size // group.size)


def split_shares(groups: Sequence[TrajectoryGroup], parts: int, per_part: int) -> list[list[TrajectoryGroup]]:
    """`groups` cut into `parts` consecutive shares of `per_part` (the last ones shorter, or empty, when fewer)."""
    return [list(groups[i * per_part : (i + 1) * per_part]) for i in range(parts)]


class GroupHandoff:
    """The leader's hand-over of each step's shares to the ranks of its group, over a gloo group of their own.

    Its collectives never time out by themselves: a follower waits for its leader's whole rollout, however long;
    a dead or stalled rank is caught by the engine's `Watchdog`.
    """

    def __init__(self, group: EngineGroup) -> None:
        import torch.distributed as dist

        self.group = group
        store = dist.PrefixStore(f"agentic_rl_handoff_{group.index}", group.store)
        self._pg: Any = dist.ProcessGroupGloo(store, group.rank, group.size, datetime.timedelta(days=7))

    async def hand_out(self, shares: list[Share]) -> Share:
        """(Leader) send every rank of the group its share (`shares[r]` to group rank r); the leader's own."""
        await anyio.to_thread.run_sync(self._broadcast, shares)
        return shares[0]

    async def receive(self) -> Share:
        """(Follower) this rank's share of the step."""
        shares = await anyio.to_thread.run_sync(self._broadcast, None)
        return shares[self.group.rank]

    def close(self) -> None:
        """Release the group's gloo process group (closing twice does nothing).

        Called at the end of a run on every rank, finished or failed, with no broadcast in flight: a gloo group
        still held when the interpreter shuts down may abort the process as its threads are torn down ("terminate
        called without an active exception", exit status -6), after a run that trained well.
        """
        pg, self._pg = self._pg, None
        if pg is not None and hasattr(pg, "shutdown"):
            pg.shutdown()  # joins its worker threads now, not during the interpreter's exit
        del pg

    def _broadcast(self, obj: Any) -> Any:
        import torch

        if self._pg is None:
            raise RuntimeError("the group hand-off is closed")

        data = pickle.dumps(obj) if self.group.is_leader else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self._pg.broadcast([size], _root()).wait()
        buffer = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if self.group.is_leader
            else torch.empty(int(size.item()), dtype=torch.uint8)
        )
        self._pg.broadcast([buffer], _root()).wait()
        return obj if self.group.is_leader else pickle.loads(buffer.numpy().tobytes())  # noqa: S301 (our leader's)


def _root() -> Any:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts


class FollowerFeed:
    """What stands for the rollout on a follower: each step's task groups come from its leader (`GroupHandoff`).

    It has the parts of `loop.scheduler.ContinuousRollout` the step loop reads, each as a rank that rolled out
    nothing reports it (the leader reports the group's rollout).
    """

    groups: list[TrajectoryGroup]
    constant: list[TrajectoryGroup]

    def __init__(self, handoff: GroupHandoff) -> None:
        self.handoff = handoff
        self.groups = []
        self.constant = []
        self.step_counts: dict[str, int] = {}

    async def serve(self) -> None:
        """Nothing to admit: wait until the step loop's task group is cancelled."""
        await anyio.sleep_forever()

    async def receive(self) -> Share:
        """This rank's share of the step's task groups."""
        groups, dropped, refused = await self.handoff.receive()
        self.step_counts = dict.fromkeys(("drawn", "kept", "constant"), 0)  # the leader counts the group's
        return groups, dropped, refused

    def step_record(self, step: int, groups: Sequence[TrajectoryGroup], task_id: Callable[[Any], Any]) -> dict:
        """The task ids file's line of step `step` (0-based): the ids of the tasks this rank trained."""
        return {"step": step + 1, "task_ids": [task_id(g.task) for g in groups]}

    def step_done(self) -> None:
        """Nothing waits for the new weights here."""

    def checkpoint(self) -> dict[str, Any]:
        """A follower holds no pending groups (its leader's checkpoint holds the group's)."""
        return {}
