"""Platform selection on CPU, CUDA and NPU. NPU branches run against a stand-in `torch_npu` module."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from agentic_rl.train.distributed import backend_for
from ascend.device import Platform, current_platform
from ascend.platform import npu_available


@pytest.fixture
def fake_npu(monkeypatch):
    """A stand-in `torch_npu` that registers `torch.npu` with two devices, as the real one does on import."""
    calls = []
    npu = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 2, set_device=lambda i: calls.append(("set_device", i)),
        mem_get_info=lambda i: (3 << 30, 32 << 30), memory_allocated=lambda i: 1 << 30,
        empty_cache=lambda: calls.append(("empty_cache",)),
    )  # fmt: skip
    module = types.ModuleType("torch_npu")
    module.__spec__ = types.SimpleNamespace(name="torch_npu", loader=None, parent="", submodule_search_locations=None)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: module.__spec__ if name == "torch_npu" else
                        __import__("importlib.machinery").machinery.PathFinder.find_spec(name))  # fmt: skip
    monkeypatch.delenv("AGENTIC_RL_DEVICE", raising=False)
    return calls


def test_this_machine_is_the_cpu_platform():
    platform = current_platform()
    assert platform == Platform("cpu") and not platform.is_accelerator
    assert platform.device(0) == "cpu" and platform.distributed_backend == "gloo"
    assert platform.visible_devices_env is None
    assert platform.memory_info()["total_bytes"] > 0
    assert not npu_available()


def test_npu_is_selected_when_torch_npu_reports_devices(fake_npu):
    platform = current_platform()
    assert platform == Platform("npu", 2)
    assert platform.device(1) == "npu:1" and platform.distributed_backend == "hccl"
    assert platform.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    platform.set_device(1)
    platform.empty_cache()  # what a sharded trainer freed counts as free for the engine started next
    assert fake_npu == [("set_device", 1), ("empty_cache",)]
    assert platform.memory_info(0) == {"free_bytes": 3 << 30, "total_bytes": 32 << 30, "allocated_bytes": 1 << 30}
    assert platform.engine_kwargs() == {"enforce_eager": True}
    with pytest.raises(ValueError, match="local rank 2"):
        platform.device(2)


def test_environment_variable_forces_the_platform(fake_npu, monkeypatch):
    monkeypatch.setenv("AGENTIC_RL_DEVICE", "cpu")
    assert current_platform().kind == "cpu"
    monkeypatch.setenv("AGENTIC_RL_DEVICE", "tpu")
    with pytest.raises(ValueError, match="AGENTIC_RL_DEVICE"):
        current_platform()


def test_engine_arguments_follow_the_platform(fake_npu, model_dir):
    from agentic_rl.engine.vllm_config import VLLMEngineConfig
    from agentic_rl.engine.vllm_config import llm_kwargs as _llm_kwargs

    npu_kwargs = _llm_kwargs(VLLMEngineConfig(model=model_dir, enable_sleep_mode=True))
    assert npu_kwargs["enable_sleep_mode"] is True and "gpu_memory_utilization" in npu_kwargs
    assert "kv_cache_memory_bytes" not in npu_kwargs
    assert "block_size" not in npu_kwargs  # vLLM's own on accelerators
    assert _llm_kwargs(VLLMEngineConfig(model=model_dir, block_size=64))["block_size"] == 64


def test_engine_arguments_on_the_cpu(model_dir):
    from agentic_rl.engine.vllm_config import VLLMEngineConfig
    from agentic_rl.engine.vllm_config import llm_kwargs as _llm_kwargs

    kwargs = _llm_kwargs(VLLMEngineConfig(model=model_dir, kv_cache_gib=0.5, enable_sleep_mode=True))
    assert kwargs["kv_cache_memory_bytes"] == 1 << 29 and "enable_sleep_mode" not in kwargs
    assert kwargs["block_size"] == 32
    assert _llm_kwargs(VLLMEngineConfig(model=model_dir, block_size=128))["block_size"] == 128
    assert _llm_kwargs(VLLMEngineConfig(model=model_dir, block_size=64, engine_kwargs={"block_size": 96}))["block_size"] == 96


@pytest.mark.parametrize(("device", "backend"), [("cpu", "gloo"), ("cuda:0", "nccl"), ("npu:1", "hccl")])
def test_collective_backend_by_device(device, backend):
    assert backend_for(device) == backend


def test_importing_ascend_does_not_import_torch_npu():
    import subprocess

    out = subprocess.run([sys.executable, "-c", "import sys, ascend; print('torch_npu' in sys.modules)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"


def test_hccl_group_comes_from_torch_npu(fake_npu, monkeypatch):
    from ascend.platform import hccl_process_group

    made = []

    class ProcessGroupHCCL:
        def __init__(self, store, rank, world_size):
            made.append((store, rank, world_size))

    for name in ("torch_npu._C", "torch_npu._C._distributed_c10d"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["torch_npu._C._distributed_c10d"].ProcessGroupHCCL = ProcessGroupHCCL
    group = hccl_process_group("store", 1, 2)
    assert isinstance(group, ProcessGroupHCCL) and made == [("store", 1, 2)]


def test_hccl_without_torch_npu_is_a_clear_error():
    from ascend.platform import hccl_process_group

    with pytest.raises(RuntimeError, match="torch_npu"):
        hccl_process_group("store", 0, 2)
