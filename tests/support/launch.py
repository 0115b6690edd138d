"""Helpers for tests that start several ranks: free ports on the loopback interface, gloo ranks as subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port_pair() -> int:
    """A free loopback port P whose P + 1 is free too (a launcher's store, and a store one port up).

    Raises:
        RuntimeError: if 50 tries found no such pair.
    """
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        try:
            with socket.socket() as b:
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def run_gloo_ranks(script: list[str], *, timeout_s: float, world: int = 2) -> list[str]:
    """Run `python *script` ("{rank}" in it replaced) as ranks 0..world-1 of a gloo group on 127.0.0.1, launched
    without torchrun; their stdout, or a failure with a rank's stderr."""
    port = free_port_pair()
    procs = []
    try:
        for rank in range(world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT), "LOCAL_RANK": str(rank),
                   "LOCAL_WORLD_SIZE": str(world)}  # fmt: skip
            env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
            args = [a.replace("{rank}", str(rank)) for a in script]
            procs.append(subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))  # fmt: skip
        outputs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [out for out, _ in outputs]


def start_gloo_ranks(script: list[str], *, world: int) -> list[subprocess.Popen[str]]:
    """Start `python *script` as ranks 0..world-1 like `run_gloo_ranks` (LOCAL_RANK set too), without waiting: the
    caller waits for them and kills them."""
    port = free_port_pair()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        args = [a.replace("{rank}", str(rank)) for a in script]
        procs.append(subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    return procs
