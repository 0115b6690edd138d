"""`init_from_env` under a launcher other than torchrun: rank 0 serves the group's store one port above MASTER_PORT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.launch import free_port_pair

ROOT = Path(__file__).resolve().parents[2]

# Each rank joins from the environment a launcher sets, averages its rank's value and checks a shard of 0..5.
_RANK = """
from agentic_rl.train.distributed import init_from_env, shard
import torch
ctx = init_from_env("cpu", timeout_s=60)
values = torch.tensor([float(ctx.rank)])
ctx.allreduce_mean_([values])
print(ctx.rank, ctx.world_size, ctx.backend, values.item(), shard(list(range(6)), ctx))
"""


def test_ranks_started_without_torchrun_join_one_gloo_group(tmp_path):
    port = free_port_pair()
    procs = []
    try:
        for rank in (0, 1):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}  # fmt: skip
            env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
            procs.append(subprocess.Popen([sys.executable, "-c", _RANK], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert [out.strip() for out, _ in outputs] == ["0 2 gloo 0.5 [0, 2, 4]", "1 2 gloo 0.5 [1, 3, 5]"]
