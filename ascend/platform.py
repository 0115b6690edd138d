"""Detection of Ascend NPUs. Importing this module never imports `torch_npu` unless it is installed."""

from __future__ import annotations

import importlib.util

__all__ = ["hccl_process_group", "npu_available"]


def npu_available() -> bool:
    """True when `torch_npu` is installed and reports at least one NPU device."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available() and npu.device_count() > 0)


def hccl_process_group(store: object, rank: int, world_size: int) -> object:
    """An HCCL process group over `store` (needs `torch_npu`).

    Raises:
        RuntimeError: if `torch_npu` is not installed.
    """
    if importlib.util.find_spec("torch_npu") is None:
        raise RuntimeError("HCCL needs torch_npu (install the 'ascend' extra on an Ascend node)")
    import torch_npu  # noqa: F401
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # type: ignore[import-not-found]

    return ProcessGroupHCCL(store, rank, world_size)
