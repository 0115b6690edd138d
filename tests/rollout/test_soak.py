"""Soak: 1,000 trajectories at 64 in flight with faults injected into ~3% of them (tools, environment, engine,
reward), and one quiesce/resume on the way. Nothing is lost, and memory and file descriptors stay flat.

The engine is `ScriptedEngine` (deterministic, no model) so the soak measures the rollout machinery itself.

The soak runs in a child process started with `MALLOC_MMAP_THRESHOLD_=131072`. Why: glibc raises its mmap
threshold after the first 10 MB tool result is freed, so later ones are carved from the (per-thread) malloc arenas,
which keep ~10 MB resident each; RSS then climbs in 10 MB steps while the Python heap stays flat (checked with
tracemalloc). A fixed threshold turns that off, so RSS measures what the rollout keeps alive. Long production runs
with tools that may return megabytes can set the same variable.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from support.engines import ScriptedEngine
from test_faults import FaultyEnvironment, HangingTool, HugeTool, RaisingTool, reward

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Sample
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, TrajectoryCheckpoint
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.types import Trajectory

N_TASKS = 1000
ROUNDS = 5  # results are tallied and dropped after each round, as a training loop does
CONCURRENCY = 64
FAULT_EVERY = 33  # ~3% of the tasks
SOAK_FAULTS = [
    "[tool:raising]", "[tool:hanging]", "[tool:huge]", "[fault:env_step]", "[fault:env_close]",
    "[fault:engine_error]", "[fault:engine_hang]", "[fault:reward_raises]", "[fault:reward_nan]",
]  # fmt: skip
FAILING = {"[tool:raising]", "[tool:hanging]", "[fault:env_step]", "[fault:env_close]", "[fault:engine_error]",
           "[fault:engine_hang]", "[fault:reward_raises]", "[fault:reward_nan]"}  # fmt: skip
RETRIED = FAILING - {"[fault:env_step]", "[fault:env_close]"}  # outside the policy: rolled out once more
# After warm-up, 800 more trajectories run. Measured here (2 loaded cores): RSS +1.3 to +3 MiB, traced Python heap
# +0.5 MiB (the test's own tallies included), fds +0. Holding on to 400 trajectories by mistake added +2.8 MiB of
# heap but only ~1.5 MiB of RSS, inside RSS noise: so the precise checks are the object counts and the heap, and
# RSS catches native leaks of >= ~10 KiB per trajectory (a leaked 10 MB tool result or session would be far beyond).
RSS_TOLERANCE = 8 * 1024 * 1024
HEAP_TOLERANCE = 1024 * 1024


def _marker(i: int) -> str:
    return SOAK_FAULTS[(i // FAULT_EVERY) % len(SOAK_FAULTS)] if i % FAULT_EVERY == 0 else ""


def _usage() -> tuple[int, int]:
    gc.collect()
    return psutil.Process().memory_info().rss, len(os.listdir("/proc/self/fd"))


async def soak(tokenizer: Any) -> dict[str, Any]:
    """Run the soak, assert that nothing is lost, and return the usage measured after each round."""
    renderer = ChatRenderer(tokenizer)
    tools = [CalculatorTool(), RaisingTool(), HangingTool(), HugeTool()]
    env = FaultyEnvironment(ToolEnvironment(tools, tools_in_system_prompt=not renderer.supports_tools))
    engine = ScriptedEngine(tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=3072, turn_timeout_s=0.5,
                           max_retries=1)  # fmt: skip
    rollout = Rollout(
        RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config, reward_fn=reward),
        n_parallel_agents=CONCURRENCY,
    )
    per_round = N_TASKS // ROUNDS
    completed: set[int] = set()
    failed: dict[int, str] = {}
    usage = []
    threads_before = threading.active_count()

    for r in range(ROUNDS):
        ids = range(r * per_round, (r + 1) * per_round)
        tasks = [{"id": i, "question": f"What is 12 * 7? {_marker(i)}", "ground_truth": "84"} for i in ids]
        if r == ROUNDS // 2:  # quiesce this round part-way, then resume it
            engine_served = engine.served

            def quiesce_midway(_: Any, start: int = engine_served) -> None:
                if engine.served - start >= per_round // 2:
                    rollout.request_quiesce()

            first = await rollout.run(tasks, on_result=quiesce_midway)
            assert first.suspended is not None and first.suspended.checkpoints
            second = await rollout.resume(first.suspended)
            assert second.suspended is None
            trajectories = first.trajectories + second.trajectories
            del first, second
        else:
            result = await rollout.run(tasks)
            assert result.suspended is None
            trajectories = result.trajectories
            del result
        assert len(trajectories) == per_round
        for t in trajectories:
            task_id = t.task["id"]
            assert task_id not in completed and task_id not in failed  # each task ends exactly once
            if t.failed:
                failed[task_id] = t.termination_reason
            else:
                completed.add(task_id)
        del trajectories, t
        gc.collect()
        usage.append((psutil.Process().memory_info().rss, len(os.listdir("/proc/self/fd"))))
        if r == 0:  # after warm-up: trace the Python heap from here on
            tracemalloc.start()
    heap_growth = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    gc.collect()
    alive = {kind.__name__: sum(isinstance(o, kind) for o in gc.get_objects()) for kind in (Trajectory, Sample,
             TrajectoryCheckpoint)}  # fmt: skip

    assert len(completed) + len(failed) == N_TASKS  # 0 lost
    expected_failed = {i for i in range(N_TASKS) if _marker(i) in FAILING}
    assert set(failed) == expected_failed
    assert 0.015 < len(expected_failed) / N_TASKS < 0.05
    assert {failed[i] for i in failed if _marker(i) == "[fault:engine_hang]"} == {TerminationReason.TIMEOUT}
    retried = sum(_marker(i) in RETRIED for i in range(N_TASKS))
    assert len(env.closed) == N_TASKS + retried and set(env.closed.values()) == {1}  # every attempt closed once
    assert engine.in_flight == 0 and env.inner._sessions == {}
    return {"usage": usage, "threads_before": threads_before, "threads_after": threading.active_count(),
            "failed": len(failed), "completed": len(completed), "heap_growth": heap_growth, "alive": alive}  # fmt: skip


@pytest.mark.slow
def test_soak_of_1000_faulty_trajectories_loses_nothing_and_stays_flat():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072",
           "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    assert report["completed"] + report["failed"] == N_TASKS
    # anyio pools its worker threads: at most its default limiter (40, rewards) plus the environment's tool limiter
    # (16) exist at once; a tool or reward stuck in a thread would show as growth beyond that.
    assert report["threads_after"] <= report["threads_before"] + 40 + 16
    (rss_warm, fds_warm), (rss_end, fds_end) = report["usage"][0], report["usage"][-1]
    print(f"soak: {report['completed']} completed, {report['failed']} failed; threads {report['threads_before']} -> "
          f"{report['threads_after']}; RSS after warm-up {rss_warm / 2**20:.1f} MiB, at end {rss_end / 2**20:.1f} "
          f"MiB; fds {fds_warm} -> {fds_end}; Python heap +{report['heap_growth'] / 2**20:.2f} MiB")  # fmt: skip
    assert report["alive"] == {"Trajectory": 0, "Sample": 0, "TrajectoryCheckpoint": 0}  # nothing retained
    assert fds_end <= fds_warm
    assert report["heap_growth"] < HEAP_TOLERANCE
    assert rss_end - rss_warm < RSS_TOLERANCE


if __name__ == "__main__":  # the child process of the test above
    import logging

    from transformers import AutoTokenizer

    from agentic_rl.models import DEFAULT_MODEL, resolve_model

    logging.basicConfig(level=logging.CRITICAL)  # the injected faults log errors by design
    tok = AutoTokenizer.from_pretrained(str(resolve_model(DEFAULT_MODEL)))
    print(json.dumps(anyio.run(soak, tok)))
