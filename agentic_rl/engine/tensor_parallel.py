"""One tensor-parallel vLLM engine over a group of T torchrun ranks: a leader drives it, the followers replay.

vLLM's `external_launcher` executor builds one shard of a tensor-parallel engine in each process of a group, and
every shard runs its own scheduler: the shards stay in step only if each is given the same requests and control
messages in the same order and steps the same number of times. So one rank of the group, its leader (the first),
takes the messages of its event loop (`commands`), sends each to the followers before acting on it (`wire` form:
no futures, no weights), then tells them whether it steps, with a digest of its state; a follower acts on the same
messages and steps with it, and stops the job when its own digest differs (the group drifted out of step). Weights
are never sent: each rank of the group loads the full tensors its own trainer gathers, and vLLM's weight loaders
keep the rank's part (`UpdateWeights`, `LoadAdapter` carry them locally).

The group's `torch.distributed` default group is its engine's world (vLLM builds its tensor-parallel group inside
it), set up before vLLM over the job's store under a prefix of its own; the messages go over a second gloo group of
the same ranks. A rank that dies or stalls cannot answer a collective, and vLLM's CPU all-reduce (shared memory)
never times out, so every rank of a group beats a counter in the job's store and watches its peers' counters
(`Watchdog`): a peer silent for `timeout_s` stops this process with an error naming the peer's rank.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentic_rl.engine.commands import Command
from agentic_rl.errors import ConfigError

__all__ = [
    "EngineGroup",
    "GroupChannel",
    "StepDigest",
    "Watchdog",
    "fatal",
    "join_engine_group",
    "remove_orphaned_segments",
    "vllm_launch",
]

logger = logging.getLogger(__name__)

#: The exit status of a rank stopped because its engine group failed (a peer silent, the group out of step).
EXIT_GROUP_FAILED = 75


@dataclass(frozen=True)
class EngineGroup:
    """This process's place in a tensor-parallel engine group.

    Attributes:
        size: T, the ranks of the group (the engine's `tensor_parallel_size`).
        rank: this process's rank within the group; 0 is the leader, which drives the engine.
        index: the group's number (global rank // T).
        local_rank: this process's rank on its node (torchrun's `LOCAL_RANK`): the card it uses.
        store: a `torch.distributed.Store` every rank of the job reaches (torchrun's); keys go under a prefix of the
            group's own.
        timeout_s: how long a peer may stay silent (no heartbeat) before this rank stops, and the timeout of the
            group's collectives.
        heartbeat_s: seconds between two heartbeats.
    """

    size: int
    rank: int
    index: int
    local_rank: int
    store: Any
    timeout_s: float = 600.0
    heartbeat_s: float = 1.0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def leader(self) -> int:
        """The global rank of the group's leader."""
        return self.index * self.size

    def global_rank(self, rank: int) -> int:
        """The global rank of the group's rank `rank`."""
        return self.leader + rank

    @property
    def prefix(self) -> str:
        return f"agentic_rl_engine_{self.index}"

    @classmethod
    def of(cls, size: int, *, rank: int, world_size: int, store: Any, timeout_s: float = 600.0) -> EngineGroup:
        """The group of global rank `rank` when the `world_size` ranks form groups of `size` consecutive ranks.

        Raises:
            ConfigError: if `size` does not divide `world_size`, or the ranks of a node (torchrun's
                `LOCAL_WORLD_SIZE`): a group's ranks share a node.
        """
        if size < 1 or world_size % size:
            raise ConfigError(
                f"engine.tensor_parallel_size={size} must divide the number of ranks ({world_size}): "
                "each group of that many consecutive ranks runs one engine"
            )
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if per_node % size:
            raise ConfigError(
                f"engine.tensor_parallel_size={size} must divide the ranks of a node ({per_node}): the ranks of "
                "one engine share a node"
            )
        local_rank = int(os.environ.get("LOCAL_RANK", rank % per_node))
        return cls(size, rank % size, rank // size, local_rank, store, timeout_s=timeout_s)


def join_engine_group(group: EngineGroup) -> Any:
    """Make the group the default `torch.distributed` group (vLLM's world), then a gloo group of the same ranks
    for the leader's messages. Every rank of the group calls it, before building its engine.

    Returns:
        The messages' process group.

    Raises:
        RuntimeError: if this process already has a default group (an engine was built in it before).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a tensor-parallel engine needs a process whose default group is not set up yet")
    timeout = datetime.timedelta(seconds=group.timeout_s)
    store = dist.PrefixStore(group.prefix, group.store)
    dist.init_process_group("gloo", store=store, rank=group.rank, world_size=group.size, timeout=timeout)
    # The messages' group never times out by itself: the leader may idle (a training step) for longer than any
    # timeout, and a dead or stalled peer is caught by the `Watchdog`.
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(days=7))


@contextlib.contextmanager
def vllm_launch(group: EngineGroup) -> Iterator[dict[str, Any]]:
    """While an engine shard of `group` is built: the `vllm.LLM` keyword arguments of a shard, and vLLM's launcher
    told the group's place.

    vLLM's `external_launcher` reads the job's `RANK` and names its CPU shared-memory all-reduce after its init
    method, the same for every group of a job (`env://`): two groups on one node would open the same segment. Here
    each group's shard says its rank in the group and an init method of the group's own (the default group is
    already set up, so vLLM only names things after it).
    """
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    original = ExecutorWithExternalLauncher._distributed_args
    ident = f"file:///{_launch_ident(group)}"

    def distributed_args(self: Any) -> tuple[str, int, int]:
        return ident, group.rank, group.local_rank

    ExecutorWithExternalLauncher._distributed_args = distributed_args
    try:
        yield {"tensor_parallel_size": group.size, "distributed_executor_backend": "external_launcher"}
    finally:
        ExecutorWithExternalLauncher._distributed_args = original


#: The start of the names of the shared-memory segments vLLM's CPU all-reduce of a group opens in /dev/shm: then
#: the leader's pid, so that a killed job's segments (vLLM cannot remove them) are known as orphans.
SEGMENT_PREFIX = "agentic_rl_engine"


def _launch_ident(group: EngineGroup) -> str:
    """The name of this launch's group, the same on each of its ranks: `SEGMENT_PREFIX`, the group, the leader's pid
    and start time (a killed job's segments, left in /dev/shm under its name, never clash with a later launch's).
    The leader publishes it in the job's store first, removing the orphaned segments of dead leaders."""
    import torch.distributed as dist

    store = dist.PrefixStore(f"{group.prefix}_ident", group.store)
    if group.is_leader:
        remove_orphaned_segments()
        store.set("ident", f"{SEGMENT_PREFIX}_{group.index}-{os.getpid()}-{time.time_ns()}")
    return store.get("ident").decode()


def remove_orphaned_segments(folder: str = "/dev/shm") -> list[str]:
    """Remove the shared-memory segments of groups whose leader process is gone (a killed job's); the names removed.
    Segments of running leaders, and other files, are left alone."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if not name.startswith(f"{SEGMENT_PREFIX}_"):
                continue
            parts = name.split("-")
            if len(parts) < 3 or not parts[1].isdigit() or _alive(int(parts[1])):
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                removed.append(name)
    if removed:
        logger.info("removed %d shared-memory segments of killed engine groups from %s", len(removed), folder)
    return removed


@dataclass(frozen=True, slots=True)
class StepDigest:
    """What a shard's engine state must agree on across the group after each message batch.

    Attributes:
        step: whether the shard runs an engine step now.
        pending: requests taken and not ended; sampled: requests in vLLM; version: the weight version;
        paused, stale: `EngineThread.paused`, `EngineThread.stale_cache`.
    """

    step: bool
    pending: int
    sampled: int
    version: int
    paused: bool
    stale: bool

    def values(self) -> list[int]:
        return [int(self.step), self.pending, self.sampled, self.version, int(self.paused), int(self.stale)]


class GroupChannel:
    """The leader's messages to its followers: per batch, the messages (before anyone acts on them), then the digest
    (after). Every rank of the group calls the same methods in the same order.

    Args:
        group: this process's place in the group.
        process_group: the messages' gloo group (`join_engine_group`).
    """

    def __init__(self, group: EngineGroup, process_group: Any) -> None:
        self.group = group
        self.process_group = process_group

    def send(self, commands: list[Command]) -> None:
        """(Leader) the batch's messages, in `wire` form."""
        import torch.distributed as dist

        dist.broadcast_object_list([commands], src=0, group=self.process_group)

    def receive(self) -> list[Command]:
        """(Follower) the leader's next batch of messages."""
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.process_group)
        return box[0]

    def agree(self, digest: StepDigest) -> None:
        """Every rank's digest after a batch: the leader's goes to the followers, each compares it with its own.

        Raises:
            GroupDriftError: (follower) when they differ: requests, weights or pause state are no longer the same.
        """
        import torch
        import torch.distributed as dist

        mine = digest.values()
        leader = torch.tensor(mine, dtype=torch.int64)
        dist.broadcast(leader, src=0, group=self.process_group)
        if leader.tolist() != mine:
            raise GroupDriftError(
                f"tensor-parallel engine group {self.group.index}: rank {self.group.global_rank(self.group.rank)} "
                f"is out of step with its leader (rank {self.group.leader}): [step, pending, sampled, version, "
                f"paused, stale] {mine} here, {leader.tolist()} on the leader"
            )


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its launcher, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class GroupDriftError(RuntimeError):
    """A follower's engine state differs from its leader's after the same messages."""


def fatal(message: str) -> None:
    """Stop this process at once with `message` (logged, and on stderr): a group whose shards can no longer step
    together would otherwise wait forever inside the engine's collectives."""
    logger.critical(message)
    try:
        sys.stderr.write(f"agentic_rl: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_GROUP_FAILED)


class Watchdog:
    """Beats this rank's counter in the job's store and watches its group peers' counters (module docstring).

    A peer whose counter has not moved for `group.timeout_s` (dead, or stopped) stops this process (`fatal`) with
    an error naming the peer's global rank. A peer that closed its engine says so first and is no longer watched.
    """

    def __init__(self, group: EngineGroup) -> None:
        import torch.distributed as dist

        self.group = group
        self._store = dist.PrefixStore(f"{group.prefix}_beats", group.store)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentic-rl-engine-watchdog", daemon=True)

    def start(self) -> None:
        self._store.set(f"pid/{self.group.rank}", str(os.getpid()))
        self._store.add(f"beat/{self.group.rank}", 1)
        self._thread.start()

    def dead_peers(self) -> list[str]:
        """The group's other ranks whose process is gone (they share this node) without having closed their engine
        first, as `rank R (pid P)`."""
        dead = []
        for r in range(self.group.size):
            if r == self.group.rank:
                continue
            with contextlib.suppress(Exception):
                if self._store.check([f"pid/{r}"]) and not self._store.add(f"closed/{r}", 0):
                    pid = int(self._store.get(f"pid/{r}"))
                    if not _alive(pid):
                        dead.append(f"rank {self.group.global_rank(r)} (pid {pid})")
        return dead

    def close(self) -> None:
        """Stop watching, and tell the peers this rank is done (they stop watching it)."""
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(Exception):
            self._store.add(f"closed/{self.group.rank}", 1)

    def _run(self) -> None:
        group = self.group
        peers = [r for r in range(group.size) if r != group.rank]
        seen = {r: (-1, time.monotonic()) for r in peers}
        while not self._stop.wait(group.heartbeat_s):
            try:
                self._store.add(f"beat/{group.rank}", 1)
                dead = self.dead_peers()
                if dead and not self._stop.is_set():
                    fatal(
                        f"tensor-parallel engine group {group.index}: {', '.join(dead)} died; stopping rank "
                        f"{group.global_rank(group.rank)}"
                    )
                for r in list(seen):
                    if self._store.add(f"closed/{r}", 0):
                        del seen[r]
                        continue
                    count = self._store.add(f"beat/{r}", 0)
                    last, since = seen[r]
                    now = time.monotonic()
                    if count != last:
                        seen[r] = (count, now)
                    elif now - since > group.timeout_s:
                        fatal(
                            f"tensor-parallel engine group {group.index}: rank {group.global_rank(r)} gave no sign "
                            f"of life for {group.timeout_s:g} s (dead or stalled); stopping rank "
                            f"{group.global_rank(group.rank)}"
                        )
            except Exception as exc:  # the store is gone: the job's launcher (or rank 0) ended
                if self._stop.is_set():
                    return
                fatal(
                    f"tensor-parallel engine group {group.index}: the job's store cannot be reached from rank "
                    f"{group.global_rank(group.rank)} ({exc}); stopping"
                )
