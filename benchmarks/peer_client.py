"""What both peer benchmarks share (`peer_verifiers.py`, `peer_sim.py`): where the peer's venv and data are, and how
a client subprocess (the `verifiers` peer, our own HTTP loop) is run and read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "gsm8k_test.jsonl"
PEER = HERE / "peer" / "verifiers_gsm8k.py"
PEER_VENV = Path(os.environ.get("PEER_VENV", "/tmp/venv-verifiers-0.2.1"))


def run_client(command: list[str], timeout_s: float, what: str) -> dict[str, Any]:
    """Run a client subprocess (offline, no progress bars) and return the JSON of its last output line, with
    `process_s` (its whole run, start-up included).

    Raises:
        RuntimeError: naming `what`, with the end of its stderr, if it exits with an error.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - t0
    return result


def run_peer(
    address: str, model: str, args: argparse.Namespace, system_prompt: str, tool: dict[str, Any]
) -> dict[str, Any]:
    """One `verifiers` evaluation against our server, in the peer venv; its JSON line."""
    command = [str(PEER_VENV / "bin" / "python"), str(PEER), "--base-url", f"http://{address}/v1", "--model", model]
    command += ["--data", str(DATA), "--tasks", str(args.tasks), "--concurrency", str(args.concurrency)]
    command += ["--max-turns", str(args.max_turns), "--max-tokens", str(args.max_tokens)]
    command += ["--system-prompt", system_prompt, "--tool-schema", json.dumps(tool)]
    if args.force_tool_calls:
        command += ["--tool-choice", "required", "--no-parallel-tool-calls"]
    result = run_client(command, args.peer_timeout, "verifiers peer")
    result["tokens_per_s"] = result["generated_tokens"] / result["wall_s"]
    result["trajectories_per_s"] = result["tasks"] / result["wall_s"]
    result["turns_per_trajectory"] = result["turns"] / result["tasks"]
    return result
