"""One small platform interface over CPU, CUDA and Ascend NPU, used by the engine, the trainer and the loop.

Only this package touches `torch_npu`; it is imported lazily, so the package imports on machines without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ascend.platform import npu_available

__all__ = ["Platform", "cpu_flags", "current_platform", "native_cpu_bf16"]

_VISIBLE = {"cpu": None, "cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
_BACKEND = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass(frozen=True, slots=True)
class Platform:
    """The accelerator kind of this process.

    Attributes:
        kind: `cpu`, `cuda` or `npu`.
        device_count: visible accelerators (0 on the CPU).
    """

    kind: str
    device_count: int = 0

    @property
    def is_accelerator(self) -> bool:
        return self.kind != "cpu"

    @property
    def distributed_backend(self) -> str:
        """Collective backend: gloo (cpu), nccl (cuda), hccl (npu)."""
        return _BACKEND[self.kind]

    @property
    def visible_devices_env(self) -> str | None:
        """The variable that restricts visible devices (`ASCEND_RT_VISIBLE_DEVICES` on Ascend), None on the CPU."""
        return _VISIBLE[self.kind]

    def device(self, local_rank: int = 0) -> str:
        """Device string for a local rank: `cpu`, `cuda:N`, `npu:N`."""
        if not self.is_accelerator:
            return "cpu"
        if self.device_count and not 0 <= local_rank < self.device_count:
            raise ValueError(f"local rank {local_rank} has no {self.kind} device ({self.device_count} visible)")
        return f"{self.kind}:{local_rank}"

    def _module(self) -> Any:
        import torch

        if self.kind == "npu":
            import torch_npu  # noqa: F401  (registers torch.npu)
        return getattr(torch, self.kind)

    def set_device(self, local_rank: int) -> None:
        """Make `local_rank`'s accelerator current (no-op on the CPU)."""
        if self.is_accelerator:
            self._module().set_device(local_rank)

    def empty_cache(self) -> None:
        """Hand the caching allocator's free blocks back to the device (no-op on the CPU), so that what a process
        freed (a model's whole copy, once sharded) counts as free for an engine started after it, which sizes its
        KV cache by the device's free memory."""
        if self.is_accelerator:
            self._module().empty_cache()

    def memory_info(self, local_rank: int = 0) -> dict[str, int]:
        """`{"free_bytes", "total_bytes", "allocated_bytes"}` of the device (the trainer logs them)."""
        if not self.is_accelerator:
            import psutil

            vm = psutil.virtual_memory()
            return {"free_bytes": int(vm.available), "total_bytes": int(vm.total), "allocated_bytes": int(vm.used)}
        module = self._module()
        free, total = module.mem_get_info(local_rank)
        return {
            "free_bytes": int(free),
            "total_bytes": int(total),
            "allocated_bytes": int(module.memory_allocated(local_rank)),
        }

    def peak_memory_bytes(self, local_rank: int = 0) -> int:
        """The most memory this process has held, in bytes: on an accelerator, the most the caching allocator had
        allocated on `local_rank`'s device (`max_memory_allocated`: tensors only, not the runtime's context); on the
        CPU, the process's peak resident set size (`resource.getrusage`, which counts everything)."""
        if self.is_accelerator:
            return int(self._module().max_memory_allocated(local_rank))
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux

    @property
    def engine_dtype(self) -> str:
        """The engine's default dtype: `bfloat16` on accelerators and on CPUs that multiply bf16 natively
        (`avx512_bf16` or `amx_bf16` on x86, `bf16` on Arm), else `float32`. Without those instructions bf16 is
        emulated: a SmolLM2-135M rollout on an AVX2-only 2-core x86 VM ran 2.9x slower in bf16 than in fp32."""
        if self.is_accelerator:
            return "bfloat16"
        return "bfloat16" if native_cpu_bf16() else "float32"

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM arguments for this platform. On Ascend, vllm-ascend registers itself as a vLLM platform plugin, so
        `vllm.LLM` needs no device argument; its sleep mode and graph capture follow the same switches as CUDA."""
        if self.kind == "npu":
            return {"enforce_eager": True}  # graph mode on Ascend needs per-model tuning; eager is the safe default
        return {}


def native_cpu_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively: `avx512_bf16` or `amx_bf16` on x86, `bf16` on Arm."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from `/proc/cpuinfo` (`flags` on x86, `Features` on Arm); empty where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def current_platform() -> Platform:
    """Detect the platform: Ascend NPU (torch_npu with devices), else CUDA, else CPU.

    `AGENTIC_RL_DEVICE` (`cpu`, `cuda`, `npu`) forces a kind.
    """
    import torch

    forced = os.environ.get("AGENTIC_RL_DEVICE")
    if forced == "cpu":
        return Platform("cpu")
    if forced in (None, "npu") and npu_available():
        return Platform("npu", int(torch.npu.device_count()))
    if forced in (None, "cuda") and torch.cuda.is_available():
        return Platform("cuda", torch.cuda.device_count())
    if forced not in (None, "cpu", "cuda", "npu"):
        raise ValueError(f"AGENTIC_RL_DEVICE must be cpu, cuda or npu, got {forced!r}")
    return Platform("cpu")
