"""Ascend NPU platform layer: everything that touches `torch_npu` lives here and is imported lazily."""

from ascend.platform import npu_available

__all__ = ["npu_available"]
