"""Sharded training with FSDP2 (`torch.distributed.fsdp.fully_shard`) over the training group's `DeviceMesh`.

With `optimizer.sharding: fsdp` every rank keeps 1/W of each parameter, of its gradient and of AdamW's two moments
(W the ranks), instead of a whole replica: `shard_model` makes each decoder layer one FSDP unit (its parameters
all-gathered just before its forward and backward, then freed; its gradients reduce-scattered) and the model root
another (embeddings, final norm, output head). The KL reference is sharded the same way and frozen, so it costs
1/W of a model per rank.

FSDP2's reduce-scatter averages the ranks' gradients, as the replicated path's all-reduce does: the GRPO loss that
each rank back-propagates, (W / N) times the sum over its own tokens (N the count over all ranks), therefore averages
to the gradient of the global mean, unchanged (`train.distributed`).

Every forward and backward of a sharded model is a collective: all ranks must run the same sequence of them. The
trainer therefore runs one forward per micro-batch (no shared-prefix cache, no length buckets: both split a
micro-batch into a number of forwards that depends on its rows) and pads every rank to the same number of
micro-batches with `idle_pass` (`GRPOTrainer._accumulate_gradients`).

Weights leave the shards one FSDP unit at a time (`full_weights`): a weight sync or a digest never holds more than
one unit's whole parameters (a decoder layer, or the root's embeddings and head) besides the shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from agentic_rl.train.grpo_config import Sharding

__all__ = [
    "Sharding",
    "decoder_layers",
    "full_adapter",
    "full_weights",
    "is_sharded",
    "shard_model",
    "unit_weights",
    "unshard_tensor",
]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a causal LM, each of which becomes one FSDP unit: the modules whose class a
    `transformers` model names in `_no_split_modules` (`LlamaDecoderLayer`, ...), else the children of its longest
    `ModuleList`.

    Raises:
        ValueError: for a model with neither.
    """
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no decoder layers to shard (no _no_split_modules, no ModuleList)")
    return list(max(lists, key=len))


def shard_model(model: torch.nn.Module, root: torch.nn.Module, mesh: Any, **policies: Any) -> None:
    """Shard `model` in place over `mesh` (FSDP2): each decoder layer one unit, then `root`, the module whose
    forward the trainer calls (the model itself, or with LoRA the `transformers` model inside peft's wrapper), the
    rest. Parameters become `DTensor`s holding this rank's shard (dim 0, padded on the last ranks).

    Frozen parameters (a LoRA base, a KL reference) are sharded too and get no gradient. `policies` go to every
    `fully_shard` call (`mp_policy`, `offload_policy`: `train.levers.fsdp_policies`).
    """
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **policies)
    fully_shard(root, mesh=mesh, **policies)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is a `DTensor` (the model was sharded)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def unshard_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a `DTensor` shard (an all-gather: every rank must call it, in the same order), or
    `tensor` itself; detached. A shard offloaded to host memory is gathered on the mesh's device."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        device_type = tensor.device_mesh.device_type
        if tensor.device.type != device_type:
            tensor = tensor.detach().to(device_type)
        return tensor.detach().full_tensor()
    return tensor.detach()


def full_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, whole tensor)` of each parameter of `model`, in `named_parameters` order; every rank must consume it
    whole, in the same order.

    Sharded, the weights leave their shards one FSDP unit at a time (`unit_weights`: one all-gather per decoder
    layer, not one per parameter), so that no more than one unit's whole parameters exist besides the shards; each
    yielded tensor is a copy the consumer may keep. Under mixed precision a unit gathers in its compute dtype, so
    there each parameter is gathered alone, in fp32 (`unshard_tensor`): an engine gets the master weights."""
    if not is_sharded(model):
        for name, param in model.named_parameters():
            yield name, param.detach()
        return
    if any(_gathers_cast(unit) for unit in _units(model)):
        for name, param in model.named_parameters():
            yield name, unshard_tensor(param)
        return
    yield from unit_weights(model)


def unit_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole parameters of a sharded `model` in `named_parameters` order, each FSDP unit unsharded once
    (`FSDPModule.unshard`: one all-gather of the unit) while its parameters are copied out, and resharded after its
    last one. A unit whose parameters are not contiguous in that order (the root: embeddings first, norm and head
    last) stays unsharded in between, beside one decoder layer at a time: one gather per unit per sync."""
    owner = _owners(model)
    names = [name for name, _ in model.named_parameters()]
    last = {id(owner[name]): i for i, name in enumerate(names)}  # where each unit's last parameter comes
    gathered: dict[int, Any] = {}
    try:
        for i, name in enumerate(names):
            unit = owner[name]
            if id(unit) not in gathered:
                unit.unshard()
                gathered[id(unit)] = unit
            yield name, model.get_parameter(name).detach().clone()
            if last[id(unit)] == i:
                gathered.pop(id(unit)).reshard()
    finally:
        for unit in gathered.values():
            unit.reshard()


def _units(model: torch.nn.Module) -> list[Any]:
    """The FSDP units (`FSDPModule`s) of `model`, outermost first."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _owners(model: torch.nn.Module) -> dict[str, Any]:
    """Each parameter name of `model` -> the innermost FSDP unit that manages it."""
    prefixes = {id(m): name for name, m in model.named_modules()}
    owner: dict[str, Any] = {}
    for unit in _units(model):  # outermost first: an inner unit overwrites its parameters' owner
        prefix = prefixes[id(unit)]
        for name, _ in unit.named_parameters():
            owner[f"{prefix}.{name}" if prefix else name] = unit
    return owner


def _gathers_cast(unit: Any) -> bool:
    """Whether `unit` all-gathers its parameters in another dtype than they are kept in (mixed precision)."""
    for group in unit._get_fsdp_state()._fsdp_param_groups:
        dtype = group.mp_policy.param_dtype
        if dtype is not None and any(dtype != p.sharded_param.dtype for p in group.fsdp_params):
            return True
    return False


def full_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole LoRA tensors of a peft model (`lora_` in their `state_dict` names), gathered one at a time when
    sharded (`unshard_tensor`: every rank must call it): what `train.lora.save_adapter` takes as `state_dict`."""
    return {name: unshard_tensor(t) for name, t in model.state_dict().items() if "lora_" in name}
