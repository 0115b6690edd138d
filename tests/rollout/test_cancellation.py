"""Cancelling a whole rollout (or timing it out) cleans up every engine request and sandbox process, and leaves no
task, thread or process behind. Each test counts them before and after.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import anyio
import psutil
import pytest
from support.engines import CountingEnvironment, ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

GUARD_S = 120  # a bound on waiting for a state (never asserted as a duration): a hang fails instead of stalling CI


async def _wait_until(condition) -> None:
    with anyio.fail_after(GUARD_S):
        while not condition():
            await anyio.sleep(0.02)


def _threads() -> set[tuple[int | None, str]]:
    """Live threads, without tqdm's monitor (a daemon that tqdm starts for any progress bar, e.g. one the engine
    shows, and that ends by itself once no bar is left)."""
    return {(t.ident, t.name) for t in threading.enumerate() if t.name != "tqdm_monitor"}


def _child_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


async def test_cancelling_a_rollout_aborts_every_engine_request_and_leaks_no_task_or_thread(engine, tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = CountingEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=512,
                           sampling={"max_tokens": 400, "min_tokens": 400, "temperature": 1.0})  # fmt: skip
    tasks = [{"id": i, "question": f"Count to {100 + i}.", "ground_truth": "0"} for i in range(8)]
    threads_before, tasks_before = _threads(), set(asyncio.all_tasks())
    assert engine.in_flight_requests == 0

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    results = []
    async with anyio.create_task_group() as tg:

        async def rollout() -> None:
            results.append(await run_tasks(tasks, one, n_parallel_agents=8))

        tg.start_soon(rollout)
        await _wait_until(lambda: engine.in_flight_requests == 8)
        tg.cancel_scope.cancel()

    assert results == []
    await _wait_until(lambda: engine.in_flight_requests == 0)  # the aborts reach the engine thread after its step
    assert await engine.call(lambda llm: llm.llm_engine.has_unfinished_requests()) is False
    assert len(env.closed) == 8 and set(env.closed.values()) == {1}
    assert set(asyncio.all_tasks()) == tasks_before
    assert _threads() <= threads_before  # no new thread (one left over by an earlier test may have ended)
    generation = await engine.generate([1, 2, 3], {"max_tokens": 4, "min_tokens": 4})  # the engine still serves
    assert len(generation.token_ids) == 4


async def test_a_rollout_timeout_aborts_its_engine_requests(engine, tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = CountingEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=512,
                           sampling={"max_tokens": 400, "min_tokens": 400, "temperature": 1.0})  # fmt: skip
    tasks = [{"id": i, "question": f"Count to {100 + i}.", "ground_truth": "0"} for i in range(4)]

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    with anyio.move_on_after(1.0) as scope:  # a timeout far shorter than 4 x 400 tokens on this CPU
        await run_tasks(tasks, one, n_parallel_agents=4)

    assert scope.cancelled_caught
    await _wait_until(lambda: engine.in_flight_requests == 0)
    assert await engine.call(lambda llm: llm.llm_engine.has_unfinished_requests()) is False
    assert len(env.closed) == 4 and set(env.closed.values()) == {1}


SLEEP_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "import time; time.sleep(600)"}}\n</tool_call>'


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")
def test_cancelling_a_rollout_kills_every_sandbox_process_and_thread(tokenizer):
    from agentic_rl.tools.sandbox import SandboxTool

    tool = SandboxTool(timeout_s=600)  # the code would sleep far longer than the test
    renderer = ChatRenderer(tokenizer)
    env = CountingEnvironment([tool], tools_in_system_prompt=True)
    engine = ScriptedEngine(tokenizer, lambda question, turn: SLEEP_CALL if turn == 0 else "done")
    config = HarnessConfig(max_steps=2, max_prompt_length=2048, max_response_length=1024)
    tasks = [{"id": i, "question": f"Sleep {i}.", "ground_truth": "0"} for i in range(4)]
    session_ids = [f"{i}-{i}" for i in range(4)]
    children_before, threads_before = _child_pids(), _threads()
    seen: dict[str, tuple[int, ...]] = {}

    async def main() -> None:
        async def one(task, idx):
            return await run_trajectory(
                task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
            )

        async def rollout() -> None:
            await run_tasks(tasks, one, n_parallel_agents=4)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rollout)

            def all_sleeping() -> bool:
                for sid in session_ids:
                    info = tool.session_info(sid)
                    if info is None or not info.pids:
                        return False
                    seen[sid] = info.pids
                return True

            await _wait_until(all_sleeping)
            await anyio.sleep(0.2)  # the code frames are in the interpreters (cleanup must not depend on it)
            tg.cancel_scope.cancel()

    anyio.run(main)  # a loop of its own: when it ends, anyio's idle worker threads end too

    assert len(seen) == 4
    assert all(tool.session_info(sid) is None for sid in session_ids)
    sandbox_pids = {pid for pids in seen.values() for pid in pids}
    assert sandbox_pids and not any(psutil.pid_exists(pid) and _not_zombie(pid) for pid in sandbox_pids)
    assert _child_pids() - children_before == set()
    assert len(env.closed) == 4 and set(env.closed.values()) == {1}
    assert engine.in_flight == 0

    async def threads_settle() -> None:  # the loop's idle worker threads were told to stop: wait until they did
        await _wait_until(lambda: _threads() <= threads_before)

    anyio.run(threads_settle)
    assert _threads() <= threads_before


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
