"""Detection of Ascend NPUs. Importing this module never imports `torch_npu` unless it is installed."""

from __future__ import annotations

import importlib.util

__all__ = ["npu_available"]


def npu_available() -> bool:
    """True when `torch_npu` is installed and reports at least one NPU device."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available() and npu.device_count() > 0)
