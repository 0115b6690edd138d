"""Ascend NPU platform layer: everything that touches `torch_npu` lives here and is imported lazily."""

from ascend.device import Platform, current_platform
from ascend.platform import hccl_process_group, npu_available

__all__ = ["Platform", "current_platform", "hccl_process_group", "npu_available"]
