"""Harness overhead and turn scaling against a deterministic simulated engine, side by side in one run.

The simulated engine stands for a continuous-batching engine with a fixed latency per token that grows with the
number of requests in flight: a turn of n tokens submitted while c requests are in flight (itself included) takes
`n * (base_s + per_request_s * c)`. With A agents all running T turns of L sampled tokens and an environment that
answers at once, the ideal rollout (the engine never waits for the harness) takes `T * L * (base_s +
per_request_s * A)`; ideal / measured is the share of that the harness achieves. Everything the harness does
between turns (decoding the turn, the environment step, the observation's template ids, bookkeeping, task start-up
and the first prompt's render) is in the measured time, on the same event loop (uvloop) as `agentic-rl rollout`.

Turn scaling runs the same harness with a zero-latency engine and reports the harness's cost per turn at 8 and 128
turns: token-in/token-out means the history is never re-rendered, so the cost per turn should stay flat.

    .venv/bin/python benchmarks/harness_overhead.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
from common import Goal, save, table, verdict
from sim_engine import SimulatedEngine

from agentic_rl import (
    ChatRenderer,
    Environment,
    HarnessConfig,
    RolloutSpec,
    Sample,
    StepResult,
    StepTrajectory,
    run_tasks,
    run_trajectory,
)


class FixedTurnsEnvironment(Environment):
    """Answers every turn with a short tool observation until `turns` assistant turns happened."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    async def reset(self, request: dict[str, Any]) -> Sample:
        messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": request["question"]}]
        return Sample(id=str(request["trajectory_id"]), task=request, messages=messages)

    async def step(self, sample: Sample) -> StepResult:
        done = sum(m["role"] == "assistant" for m in sample.messages) >= self.turns
        return StepResult([] if done else [{"role": "tool", "content": "42"}], done, {})


def make_tasks(n: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "question": f"question {i}: what is {i} times 6 plus {i % 7}?", "ground_truth": "42"}
        for i in range(n)
    ]


async def timed_rollout(engine: SimulatedEngine, renderer: ChatRenderer, environment: Environment, tasks: list[dict[str, Any]],
                        max_steps: int, check_alignment: bool = False) -> tuple[list[StepTrajectory], float]:  # fmt: skip
    """All `tasks` in flight at once through `run_tasks` / `run_trajectory`: the trajectories (none failed) and wall seconds."""
    config = HarnessConfig(max_steps=max_steps, max_prompt_length=1 << 20, max_response_length=1 << 20,
                           sampling={"max_tokens": 64}, check_alignment=check_alignment)  # fmt: skip

    async def one(task: dict[str, Any], idx: int) -> Any:
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=environment, renderer=renderer, config=config)
        )

    t0 = time.perf_counter()
    trajs = await run_tasks(tasks, one, n_parallel_agents=len(tasks))
    elapsed = time.perf_counter() - t0
    assert not any(t.failed for t in trajs), [t.error for t in trajs if t.failed]
    return trajs, elapsed


async def rollout(engine: SimulatedEngine, renderer: ChatRenderer, agents: int, turns: int) -> float:
    """Wall seconds of `agents` trajectories of `turns` turns, all in flight at once."""
    trajs, elapsed = await timed_rollout(engine, renderer, FixedTurnsEnvironment(turns), make_tasks(agents), turns)
    assert all(t.metrics["steps"] == turns for t in trajs)
    return elapsed


def run(renderer: ChatRenderer, tokens: list[int], quick: bool) -> dict[str, Any]:
    base_s, per_request_s, turns = 0.01, 0.0001, 8
    options = {"backend_options": {"use_uvloop": True}}
    results: dict[str, Any] = {"base_s": base_s, "per_request_s": per_request_s, "turns": turns,
                               "tokens_per_turn": len(tokens) + 1, "overhead": [], "turn_scaling": {}}  # fmt: skip
    anyio.run(rollout, SimulatedEngine(tokens, renderer.end_of_turn_id), renderer, 4, 2, **options)  # warm up
    rows = []
    repeats = 3 if quick else 5  # best of: wake-up latency spikes of a shared VM are not the harness's
    for agents in (1, 8, 64):
        engine = SimulatedEngine(tokens, renderer.end_of_turn_id, base_s, per_request_s)
        ideal = turns * (len(tokens) + 1) * engine.token_latency(agents)
        measured = min(anyio.run(rollout, engine, renderer, agents, turns, **options) for _ in range(repeats))
        results["overhead"].append(
            {"agents": agents, "ideal_s": ideal, "measured_s": measured, "ratio": ideal / measured}
        )
        rows.append((agents, ideal, measured, ideal / measured))
    print(f"harness overhead: {turns} turns of {len(tokens) + 1} tokens, {base_s * 1e3:g} ms + "
          f"{per_request_s * 1e3:g} ms x in-flight per token, best of {repeats}")  # fmt: skip
    print(table(["agents", "ideal s", "measured s", "ideal/measured"], rows))
    fast = SimulatedEngine(tokens, renderer.end_of_turn_id)
    agents = 8
    for n_turns in (8, 128):
        repeats = 3 if quick else 10
        best = min(anyio.run(rollout, fast, renderer, agents, n_turns, **options) for _ in range(repeats))
        results["turn_scaling"][str(n_turns)] = best / (agents * n_turns)
    per8, per128 = results["turn_scaling"]["8"], results["turn_scaling"]["128"]
    results["turn_scaling"]["ratio_128_over_8"] = per128 / per8
    print(f"turn scaling (zero-latency engine, {agents} agents, best of repeats): {per8 * 1e3:.3f} ms/turn at 8 "
          f"turns, {per128 * 1e3:.3f} ms/turn at 128 turns, ratio {per128 / per8:.2f}")  # fmt: skip
    return results


def smollm2_turn() -> tuple[ChatRenderer, list[int]]:
    """SmolLM2-135M-Instruct's renderer and the ids of the assistant turn the simulated engine returns."""
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m-instruct")))
    return ChatRenderer(tokenizer), tokenizer.encode(
        " The answer is forty two, computed step by step.", add_special_tokens=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = run(*smollm2_turn(), args.quick)
    at64 = next(r for r in results["overhead"] if r["agents"] == 64)
    goal = verdict(Goal("harness ideal/measured at 64 agents", at64["ratio"], ">=", 0.98),
                   Goal("per-turn cost 128/8 turns", results["turn_scaling"]["ratio_128_over_8"], "<=", 1.1, "x", 2))  # fmt: skip
    save("harness_overhead", results, args.out, args.quick, goal=goal)


if __name__ == "__main__":
    main()
