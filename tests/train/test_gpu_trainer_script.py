"""`benchmarks/gpu_trainer.py`, the GPU check, runs its own code on the CPU (`--device cpu --tiny`): every lever set
trains, its sync reads every weight once, and the plan answers; without a CUDA device its default run measures
nothing and says so."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/gpu_trainer.py"


def test_the_gpu_check_runs_its_code_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--prompt", "16", "--response",
                           "16", "--steps", "1", "--rows", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "engine part: not run" in proc.stdout
    result = json.loads(out.read_text())
    assert [r["levers"] for r in result["runs"]] == ["bf16", "bf16 + ckpt", "bf16 + ckpt + offload"]
    tiny = {"hidden": 64, "layers": 2, "mlp": 128, "vocab": 49152}
    per_layer = 4 * tiny["hidden"] ** 2 + 3 * tiny["hidden"] * tiny["mlp"] + 2 * tiny["hidden"]
    parameters = tiny["vocab"] * tiny["hidden"] + tiny["layers"] * per_layer + tiny["hidden"]  # tied head
    for run in result["runs"]:
        assert run["sync_bytes"] == 2 * parameters  # every weight read once, into bf16 buffers
        assert all(math.isfinite(run[k]) and run[k] > 0 for k in ("step_seconds", "sync_seconds", "planned_gib"))
        assert run["peak_gib"] is None  # no allocator peak on the CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_cuda_device_the_gpu_check_measures_nothing():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and "no CUDA device here: nothing measured" in proc.stdout
