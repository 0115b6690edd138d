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

Weights leave the shards one parameter at a time (`full_weights`): a weight sync or a digest never holds more than
one whole parameter besides the shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import torch

__all__ = [
    "Sharding",
    "decoder_layers",
    "full_adapter",
    "full_weights",
    "is_sharded",
    "shard_model",
    "unshard_tensor",
]

Sharding = Literal["replicate", "fsdp"]
"""How the ranks of a torchrun job hold the trained model: `replicate` (a whole copy on each, gradients
all-reduced) or `fsdp` (FSDP2 shards, `shard_model`)."""


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
    """`(name, whole tensor)` of each parameter of `model`, in `named_parameters` order, gathered one at a time
    when sharded (`unshard_tensor`): the consumer should drop each before asking for the next, so that no more than
    one whole parameter exists besides the shards. Every rank must consume it whole, in the same order."""
    for name, param in model.named_parameters():
        yield name, unshard_tensor(param)


def full_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole LoRA tensors of a peft model (`lora_` in their `state_dict` names), gathered one at a time when
    sharded (`unshard_tensor`: every rank must call it): what `train.lora.save_adapter` takes as `state_dict`."""
    return {name: unshard_tensor(t) for name, t in model.state_dict().items() if "lora_" in name}
