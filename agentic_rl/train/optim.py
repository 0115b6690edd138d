"""The optimizer both trainers (GRPO and SFT) build."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["adamw"]

#: Device types whose PyTorch build has a fused AdamW kernel.
_FUSED_DEVICES = frozenset({"cpu", "cuda"})


def adamw(parameters: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """`torch.optim.AdamW` over the parameters that require gradients, fused where the device has the kernel.

    Fused AdamW is one kernel per parameter instead of a chain of element-wise ops: for SmolLM2-135M in fp32 on a
    2-core CPU, 0.08 s per step instead of 0.7-1.2 s (PyTorch's CPU default is the per-op loop). Same update rule
    (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019), up to float rounding.
    """
    params = [p for p in parameters if p.requires_grad]
    fused = bool(params) and all(p.device.type in _FUSED_DEVICES and p.dtype.is_floating_point for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)
