"""The optimizer both trainers (GRPO and SFT) build."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["adamw", "load_optimizer_state"]

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


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)`, keeping this optimizer's own `fused` / `foreach` choice.

    PyTorch restores every saved group option, so a checkpoint written by an unfused optimizer (or on a device
    without the fused kernel) would otherwise switch the fused path off, or on where it does not exist.

    Raises:
        ValueError: from PyTorch, if the saved parameter groups do not fit this optimizer's.
    """
    chosen = [{key: group.get(key) for key in ("fused", "foreach")} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, options in zip(optimizer.param_groups, chosen, strict=True):
        group.update(options)
        if options["fused"]:  # the fused kernels read `step` as a float32 tensor on the parameter's device
            for param in group["params"]:
                saved = optimizer.state.get(param, {})
                if torch.is_tensor(saved.get("step")):
                    saved["step"] = saved["step"].to(device=param.device, dtype=torch.float32)
