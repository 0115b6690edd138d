"""Data parallelism across torchrun ranks (on one node or several), each rank owning one colocated engine.

vLLM's in-process engine sets up its own single-rank `torch.distributed` default group, so the training group is
a separate process group over its own key prefix in torchrun's store (`MASTER_ADDR:MASTER_PORT`, served by the
launcher of node 0; launched otherwise, rank 0 serves a store on `MASTER_PORT + 1`). Gradients are averaged with one
all-reduce of a flat buffer per step (what DDP does, without DDP's need for the default group), and initial
weights are broadcast from rank 0 so every rank starts, and therefore stays, identical.

The group is registered with `torch.distributed` under `TRAIN_GROUP` (not as the default group, which stays
vLLM's), so that a `DeviceMesh` over it (`DistContext.mesh`) can carry FSDP2's collectives (`train.sharding`).

Averaging is right only for a loss whose ranks share one normalizer. A step's loss is a mean over all ranks' tokens
(or sequences), L = (1/N) sum_k sum_{t on rank k} l_t with N the global count (`allreduce_sum` of the ranks'
counts), so each of the W ranks back-propagates L_k = (W/N) sum_{t on rank k} l_t and the average of the gradients,
(1/W) sum_k grad L_k, is grad L whatever the ranks' shares of N (`GRPOTrainer`). Rank-local means, averaged, would
weigh a token by 1 / (W * its rank's count) instead.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from agentic_rl.errors import ConfigError

__all__ = ["TRAIN_GROUP", "DistContext", "backend_for", "init_from_env", "registered_group", "shard"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The training group's name in `torch.distributed` and its key prefix in torchrun's store.
TRAIN_GROUP = "agentic_rl_train"


def backend_for(device: str) -> str:
    """Collective backend for a device type: `gloo` (cpu), `nccl` (cuda), `hccl` (npu).

    Raises:
        ConfigError: for another device type.
    """
    from ascend.device import Platform

    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda", "npu"):
        raise ConfigError(f"no collective backend for device {device!r}")
    return Platform(kind).distributed_backend


@dataclass
class DistContext:
    """This process's place in the data-parallel job.

    Attributes:
        rank: global rank (0 when not distributed).
        world_size: number of ranks.
        group: the training process group, None when `world_size == 1`.
        backend: `gloo`, `nccl` or `hccl`.
        device_type: `cpu`, `cuda` or `npu`.
        store: the job's store (torchrun's, or rank 0's), which every rank reaches; None on a single rank. A
            tensor-parallel engine group meets there (`agentic_rl.engine.tensor_parallel`).
    """

    rank: int = 0
    world_size: int = 1
    group: Any = None
    backend: str = "gloo"
    device_type: str = "cpu"
    store: Any = field(default=None, repr=False)
    _mesh: Any = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mesh(self) -> Any:
        """The 1-D `DeviceMesh` (dimension `dp`) of the training group, built once; FSDP2 shards over it.

        The mesh is given this process's training rank itself: the default process group, from which a mesh
        would otherwise read it, is the colocated engine's own single-rank group.

        Raises:
            RuntimeError: on a context without a group (`solo` makes one for a single rank).
        """
        if self.group is None:
            raise RuntimeError("a DeviceMesh needs a training group (launch with torchrun, or DistContext.solo())")
        if self._mesh is None:
            from torch.distributed.device_mesh import DeviceMesh

            mesh = DeviceMesh(
                self.device_type,
                torch.arange(self.world_size),
                mesh_dim_names=("dp",),
                _init_backend=False,
                _rank=self.rank,
            )
            mesh._dim_group_names = [self.group.group_name]
            mesh._pg_registry[self.group.group_name] = self.group
            self._mesh = mesh
        return self._mesh

    @classmethod
    def solo(cls, device: str = "cpu") -> DistContext:
        """A one-rank training group of this process alone (a `HashStore`, nothing to connect to), for FSDP2 on one
        rank: the CPU offload and mixed precision of `fully_shard` need a mesh even with nothing to shard."""
        import torch.distributed as dist

        backend = backend_for(device)
        store = dist.PrefixStore(TRAIN_GROUP, dist.HashStore())
        collectives, host = _backends(backend, store, 0, 1, datetime.timedelta(seconds=600))
        kind = device.split(":")[0]
        group = registered_group(collectives, store, 0, 1, backend=backend, device_type=kind, host=host)
        return cls(rank=0, world_size=1, group=group, backend=backend, device_type=kind)

    def allreduce_max(self, value: float) -> float:
        """The largest of every rank's `value` (every rank must call it)."""
        local = torch.tensor([value], dtype=torch.float64)
        if self.group is not None:
            import torch.distributed as dist

            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.MAX
            self.group.allreduce([local], opts).wait()
        return float(local.item())

    def allreduce_mean_(self, tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None) -> None:
        """Average `tensors` across ranks in place, with one all-reduce of a flat buffer (in `dtype`, default
        theirs: bf16 halves the bytes sent, its sums rounded to bf16)."""
        if self.group is None or not tensors:
            return
        flat = torch.cat([t.reshape(-1).to(dtype or t.dtype) for t in tensors])
        self.group.allreduce([flat]).wait()
        flat /= self.world_size
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    def allreduce_sum(self, values: Sequence[float]) -> list[float]:
        """The sum over ranks of each of `values` (same length on every rank; float64, exact for counts < 2**53).

        Every rank must call it, with or without anything to count.
        """
        local = torch.tensor(list(values), dtype=torch.float64)
        if self.group is not None and local.numel():
            self.group.allreduce([local]).wait()
        return local.tolist()

    def allreduce_grads_(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        """Average the gradients of `model` across ranks (missing gradients count as zero), reduced in `dtype`
        (default: the gradients' own).

        The average is the gradient of the step's loss only when each rank's loss is the sum over its own tokens
        (or sequences) times W / N, N the count over all ranks (module docstring).
        """
        if self.group is None:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.allreduce_mean_([p.grad for p in params], dtype)

    def broadcast_params_(self, model: torch.nn.Module) -> None:
        """Copy rank 0's parameters to every rank."""
        if self.group is None:
            return
        with torch.no_grad():
            for p in model.parameters():
                self.group.broadcast(p.data, 0).wait()

    def close(self) -> None:
        """Leave the training group: wait until every rank gets here, then release the group.

        Every rank must call it. A group still held when the interpreter shuts down may abort the process as its
        threads are torn down ("terminate called without an active exception", exit status -6). Afterwards the
        collectives do nothing, as in a single-rank context.
        """
        if self.group is None:
            return
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        group, self.group, self._mesh = self.group, None, None
        if group not in c10d._world.pg_map:  # gone already: vLLM's shutdown destroys every registered group
            return
        group.barrier().wait()
        dist.destroy_process_group(group)  # unregistered: nothing holds it when the interpreter shuts down

    def broadcast_floats(self, values: Sequence[float]) -> list[float]:
        """Rank 0's `values` on every rank (same length on all ranks; float64, exact for integers < 2**53).

        Every rank must call it: a decision taken from files (which checkpoint to resume) is taken once, on rank 0,
        so that no rank reads the folder at another moment and goes another way.
        """
        local = torch.tensor(list(values), dtype=torch.float64)
        if self.group is not None and local.numel():
            self.group.broadcast(local, 0).wait()
        return local.tolist()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank (every rank must call it).

        Two all-gathers over the training group: the pickled sizes, then the bytes padded to the longest.
        """
        if self.group is None:
            return [obj]
        import pickle

        data = pickle.dumps(obj)
        sizes = [int(n) for (n,) in self.gather_floats([float(len(data))])]
        local = torch.zeros(max(sizes), dtype=torch.uint8)
        local[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        self.group.allgather([out], [local]).wait()
        return [pickle.loads(t[:n].numpy().tobytes()) for t, n in zip(out, sizes, strict=True)]  # noqa: S301

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's `values` (same length on all ranks), in rank order."""
        local = torch.tensor(list(values), dtype=torch.float64)
        if self.group is None:
            return [local.tolist()]
        out = [torch.zeros_like(local) for _ in range(self.world_size)]
        self.group.allgather([out], [local]).wait()
        return [t.tolist() for t in out]


def init_from_env(device: str = "cpu", *, timeout_s: float = 600.0) -> DistContext:
    """Join the torchrun job described by `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, if any.

    Under torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`) the group meets in the launcher's store at
    `MASTER_ADDR:MASTER_PORT`; under another launcher rank 0 serves a store on `MASTER_PORT + 1`. The collectives
    then connect rank to rank on ports the backend picks (gloo: `GLOO_SOCKET_IFNAME` picks the interface).

    Returns:
        A single-rank context when `WORLD_SIZE` is unset or 1.

    Raises:
        ConfigError: if the torchrun variables are incomplete, or the backend is unavailable.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    try:
        rank = int(os.environ["RANK"])
        addr = os.environ["MASTER_ADDR"]
        port = int(os.environ["MASTER_PORT"])
    except KeyError as exc:
        raise ConfigError(f"WORLD_SIZE={world} but {exc.args[0]} is not set; launch with torchrun") from None
    import torch.distributed as dist

    backend = backend_for(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's own store serves MASTER_ADDR:MASTER_PORT
        base = dist.TCPStore(addr, port, world, False, timeout=timeout)
    else:  # another launcher: rank 0 serves a store one port up (MASTER_PORT may be the launcher's)
        base = dist.TCPStore(addr, port + 1, world, rank == 0, timeout=timeout)
    store = dist.PrefixStore(TRAIN_GROUP, base)
    collectives, host = _backends(backend, store, rank, world, timeout)
    device_type = device.split(":")[0]
    group = registered_group(collectives, store, rank, world, backend=backend, device_type=device_type, host=host)
    logger.info("rank %d of %d joined the training group (%s)", rank, world, backend)
    return DistContext(rank=rank, world_size=world, group=group, backend=backend, device_type=device_type, store=base)


def _backends(backend: str, store: Any, rank: int, world: int, timeout: datetime.timedelta) -> tuple[Any, Any]:
    """The training group's backend objects over `store`: the device's collectives (gloo, NCCL, or torch_npu's
    HCCL) and, beside an accelerator's, a gloo backend for host tensors (None on the CPU)."""
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout), None
    if backend == "nccl":
        collectives = dist.ProcessGroupNCCL(store, rank, world)
    else:
        from ascend.platform import hccl_process_group

        collectives = hccl_process_group(store, rank, world)
    return collectives, dist.ProcessGroupGloo(dist.PrefixStore("host", store), rank, world, timeout)


def registered_group(
    collectives: Any, store: Any, rank: int, world: int, *, backend: str, device_type: str, host: Any = None
) -> Any:
    """A `torch.distributed.ProcessGroup` named `TRAIN_GROUP` over the backend object `collectives` (gloo, NCCL or
    HCCL), registered with `torch.distributed` as `new_group` registers a group, but beside the default group
    rather than inside it: functional collectives (DTensor's, FSDP2's) find it by name, `get_group_rank` by the
    identity mapping of its ranks.

    Args:
        collectives: the backend object (`ProcessGroupGloo`, `ProcessGroupNCCL`, torch_npu's `ProcessGroupHCCL`).
        store: the store the group met in.
        rank / world: this process's rank and the group's size.
        backend: `gloo`, `nccl` or `hccl`.
        device_type: the device type its tensors live on (`cpu`, `cuda`, `npu`).
        host: a gloo backend for the group's host tensors beside an accelerator's (the step's counts and maxima,
            FSDP2 shards offloaded to host memory); None on the CPU, where `collectives` is gloo already.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    kinds = dist.ProcessGroup.BackendType
    kind = {"gloo": kinds.GLOO, "nccl": kinds.NCCL}.get(backend, kinds.CUSTOM)
    group = dist.ProcessGroup(store, rank, world)
    group._set_default_backend(kind)
    if hasattr(collectives, "_set_sequence_number_for_group"):
        collectives._set_sequence_number_for_group()
    group._register_backend(torch.device(device_type), kind, collectives)
    if host is not None:
        group._register_backend(torch.device("cpu"), kinds.GLOO, host)
    group._set_group_name(TRAIN_GROUP)
    group._set_group_desc("agentic_rl training group")
    ranks = {r: r for r in range(world)}
    if hasattr(c10d, "_register_pg_in_world"):
        config = f"{device_type}:{backend}"
        c10d._register_pg_in_world(
            group, backend_name=backend, store=store, group_name=TRAIN_GROUP, backend_config=config, rank_mapping=ranks
        )
    else:  # older torch: the same entries, one by one
        c10d._world.pg_map[group] = (backend, store)
        c10d._world.pg_names[group] = TRAIN_GROUP
        c10d._world.pg_backend_config[group] = f"{device_type}:{backend}"
        c10d._world.pg_group_ranks[group] = ranks
        c10d._register_process_group(TRAIN_GROUP, group)
    return group


def shard(items: Sequence[T], ctx: DistContext) -> list[T]:
    """This rank's share of `items` (round-robin), so that whole task groups stay on one rank."""
    return list(items[ctx.rank :: ctx.world_size])
