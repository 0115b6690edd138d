"""Harness overhead and turn scaling against a deterministic simulated engine, side by side in one run.

The simulated engine behaves like continuous batching: every `step_s` seconds each active request gets one more
token. With A agents all running T turns of L sampled tokens and an environment that answers at once, the ideal
rollout takes T * L * step_s; the ratio ideal / measured is the share of the engine's time the harness keeps it
busy. Turn scaling runs the same harness with a zero-latency engine and reports the cost per turn at 8 and 128
turns (token-in/token-out means the history is never re-rendered, so the cost per turn should stay flat).

    .venv/bin/python benchmarks/harness_overhead.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from agentic_rl import ChatRenderer, Environment, Generation, HarnessConfig, Sample, StepResult, run_tasks, run_trajectory


class SimulatedEngine:
    """Deterministic batched engine: one token per active request every `step_s` seconds."""

    def __init__(self, step_s: float, tokens: list[int], eot: int, max_model_len: int = 1 << 20) -> None:
        self.step_s, self.tokens, self.eot, self._max = step_s, tokens, eot, max_model_len

    @property
    def max_model_len(self) -> int:
        return self._max

    async def generate(self, prompt_ids: Sequence[int], sampling: Mapping[str, Any]) -> Generation:
        n = min(len(self.tokens), int(sampling["max_tokens"]) - 1)
        if self.step_s:
            # Sleeping n steps from the start of a shared clock models lockstep batching of all active requests.
            await anyio.sleep(self.step_s * (n + 1))
        ids = [*self.tokens[:n], self.eot]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


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


async def rollout(engine: SimulatedEngine, renderer: ChatRenderer, agents: int, turns: int) -> float:
    config = HarnessConfig(max_steps=turns, max_prompt_length=1 << 20, max_response_length=1 << 20,
                           sampling={"max_tokens": 64}, check_alignment=False)  # fmt: skip
    env = FixedTurnsEnvironment(turns)
    tasks = [{"id": i, "question": f"question {i}", "ground_truth": "42"} for i in range(agents)]
    t0 = time.perf_counter()
    trajs = await run_tasks(tasks, lambda t, i: run_trajectory(t, i, engine=engine, environment=env,
                                                               renderer=renderer, config=config), n_parallel_agents=agents)  # fmt: skip
    elapsed = time.perf_counter() - t0
    assert all(not t.failed and t.metrics["steps"] == turns for t in trajs), [t.error for t in trajs if t.failed]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/harness_overhead.json")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m-instruct")))
    renderer = ChatRenderer(tokenizer)
    tokens = tokenizer.encode(" The answer is forty two, computed step by step.", add_special_tokens=False)
    step_s, turns = (0.005, 4) if args.quick else (0.01, 8)
    results: dict[str, Any] = {"overhead": [], "turn_scaling": {}}
    anyio.run(rollout, SimulatedEngine(0.0, tokens, renderer.end_of_turn_id), renderer, 2, 2)  # compile the template
    print(f"harness overhead: {turns} turns of {len(tokens) + 1} tokens, {step_s * 1000:.0f} ms per engine step")
    print(f"{'agents':>7}{'ideal s':>10}{'measured s':>12}{'ideal/measured':>16}")
    for agents in (1, 8, 64):
        engine = SimulatedEngine(step_s, tokens, renderer.end_of_turn_id)
        ideal = turns * (len(tokens) + 1) * step_s
        measured = anyio.run(rollout, engine, renderer, agents, turns)
        results["overhead"].append({"agents": agents, "ideal_s": ideal, "measured_s": measured, "ratio": ideal / measured})
        print(f"{agents:>7}{ideal:>10.3f}{measured:>12.3f}{ideal / measured:>16.3f}")
    fast = SimulatedEngine(0.0, tokens, renderer.end_of_turn_id)
    agents = 8
    for n_turns in (8, 128):
        elapsed = anyio.run(rollout, fast, renderer, agents, n_turns)
        results["turn_scaling"][str(n_turns)] = elapsed / (agents * n_turns)
    per8, per128 = results["turn_scaling"]["8"], results["turn_scaling"]["128"]
    results["turn_scaling"]["ratio_128_over_8"] = per128 / per8
    print(f"turn scaling (zero-latency engine, {agents} agents): {per8 * 1e3:.3f} ms/turn at 8 turns, "
          f"{per128 * 1e3:.3f} ms/turn at 128 turns, ratio {per128 / per8:.2f}")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
