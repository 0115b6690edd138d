"""The trainer's memory levers: mixed precision, activation checkpointing and CPU offload (`GRPOConfig` fields).

- `precision: bf16`: the matrix products run in bf16 while the master weights, their gradients and AdamW's moments
  stay fp32. Sharded, FSDP2's `MixedPrecisionPolicy` all-gathers each unit's parameters cast to bf16 and reduces
  the gradients in `reduce_dtype` into fp32 shards; whole, `torch.autocast` casts per operation (norms and the
  softmax stay fp32). The frozen KL reference needs no master copy: it is held in bf16.
- `activation_checkpointing`: transformers' per-layer checkpointing (`gradient_checkpointing_enable`, the
  non-reentrant `torch.utils.checkpoint`): a decoder layer keeps only its input during the forward and runs again
  in the backward. Gradients are those of the plain forward; the price is about one more forward of compute.
  A checkpointed layer runs without a key/value cache, so the trainer's shared-prefix forward is off.
- `cpu_offload`: FSDP2's `CPUOffloadPolicy`: parameter, gradient and optimizer-state shards live in host memory and
  the optimizer steps there; each unit's parameters are copied to the device for its all-gather.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch

from agentic_rl.errors import ConfigError

__all__ = ["Precision", "autocast", "compute_dtype", "enable_activation_checkpointing", "fsdp_policies"]

Precision = Literal["fp32", "bf16"]
"""`fp32` computes in fp32; `bf16` computes in bf16 over fp32 master weights (mixed precision)."""

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compute_dtype(precision: Precision) -> torch.dtype:
    """The dtype the matrix products run in: `torch.float32` or `torch.bfloat16`."""
    return _DTYPES[precision]


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager[Any]:
    """`torch.autocast` to bf16 on `device`'s type for `bf16` (the unsharded path's mixed precision), else a no-op."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype(precision))


def fsdp_policies(precision: Precision, reduce_dtype: Precision, cpu_offload: bool) -> dict[str, Any]:
    """Keyword arguments of `fully_shard` for the levers: `mp_policy` (parameters all-gathered in the compute
    dtype, gradients reduce-scattered in `reduce_dtype`; none when both are fp32) and `offload_policy`
    (`CPUOffloadPolicy`, host memory pinned only where a CUDA or NPU device can use it)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    policies: dict[str, Any] = {}
    if precision != "fp32" or reduce_dtype != "fp32":
        policies["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=compute_dtype(precision), reduce_dtype=compute_dtype(reduce_dtype)
        )
    if cpu_offload:
        policies["offload_policy"] = CPUOffloadPolicy(pin_memory=_can_pin())
    return policies


def _can_pin() -> bool:
    """Whether pinned host memory helps (a CUDA or NPU device to copy to)."""
    npu = getattr(torch, "npu", None)
    return torch.cuda.is_available() or bool(npu is not None and npu.is_available())


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint every decoder layer of a `transformers` model (or a peft model wrapping one), non-reentrant.

    Raises:
        ConfigError: for a model without transformers' gradient checkpointing.
    """
    supports = getattr(model, "supports_gradient_checkpointing", None)
    if supports is None:  # a peft wrapper answers for the transformers model inside it
        supports = getattr(getattr(model, "get_base_model", lambda: None)(), "supports_gradient_checkpointing", False)
    if not supports or not hasattr(model, "gradient_checkpointing_enable"):
        raise ConfigError(
            f"optimizer.activation_checkpointing: {type(model).__name__} has no per-layer checkpointing "
            "(transformers' gradient_checkpointing_enable); turn it off for this model"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
