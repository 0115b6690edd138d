"""Engine utilization: the full multi-turn rollout vs the engine's own batch generation of the same tokens.

One in-process vLLM engine (SmolLM2-135M-Instruct, the platform's default dtype) serves three runs of the same work,
one after another in one process:

1. `rollout`: `n` GSM8K questions, all in flight, each for `turns` turns; after every assistant turn the
   environment runs the real `CalculatorTool` (in a worker thread, as `ToolEnvironment` does) and inserts its
   result as a tool observation. Greedy sampling with `min_tokens` so that every turn has real length.
2. `engine facade`: the same number of sampled tokens per trajectory as one request each through
   `VLLMEngine.generate` (`min_tokens` = `max_tokens`: fixed length), all in flight: the engine thread and futures without turns.
3. `vLLM offline`: the same requests as one `LLM.generate` call on the engine thread: vLLM's own best case.

utilization = vLLM offline time / rollout time. The rollout also prefills its observations and waits one engine
step per turn boundary; both are counted against it. The three runs repeat `--repeats` times (5, quick 3), so
rollout and offline alternate (rollout, offline, rollout, offline, ...); the goal is on the median utilization,
reported with its min and max (this machine's noise moves single runs by more than the gap).

    .venv/bin/python benchmarks/engine_utilization.py [--quick] [--agents N] [--turns T] [--repeats R] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
from common import Goal, save, table, verdict

from agentic_rl import ChatRenderer, Environment, HarnessConfig, Sample, StepResult, run_tasks, run_trajectory
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gsm8k_test.jsonl")


class CalculatorEveryTurn(Environment):
    """Runs the calculator after every assistant turn and shows its result, for a fixed number of turns."""

    def __init__(self, turns: int) -> None:
        self.turns, self.calculator = turns, CalculatorTool()

    async def reset(self, request: dict[str, Any]) -> Sample:
        messages = [{"role": "system", "content": "Solve the problem step by step."},
                    {"role": "user", "content": request["question"]}]  # fmt: skip
        return Sample(id=str(request["trajectory_id"]), task=request, messages=messages)

    async def step(self, sample: Sample) -> StepResult:
        turn = sum(m["role"] == "assistant" for m in sample.messages)
        if turn >= self.turns:
            return StepResult([], True, {})
        expression = f"{len(sample.messages[-1]['content'])} * {turn + 3} + 7"
        result = await anyio.to_thread.run_sync(self.calculator.execute, {"expression": expression})
        return StepResult(
            [{"role": "tool", "content": f"calculator({expression}) = {result}"}], False, {"tool_calls": 1}
        )


def fixed(n: int) -> dict[str, Any]:
    """Sampling of exactly `n` tokens (`min_tokens` = `max_tokens`), greedy, with the sampled tokens' logprobs and no
    detokenizing: the engine's work of one rollout turn of that length."""
    return {"temperature": 0.0, "min_tokens": n, "max_tokens": n, "logprobs": 0, "detokenize": False}


async def facade_seconds(engine: Any, prompts: list[list[int]], counts: list[int]) -> float:
    """Seconds (wall clock) that `engine.generate` takes for all `prompts` in flight at once, request i sampling
    exactly `counts[i]` tokens (`fixed`), after a prefix-cache reset. Raises AssertionError if a request returned
    another number of tokens."""
    await engine.call(lambda llm: llm.reset_prefix_cache())
    lengths: list[int] = []

    async def one(prompt: list[int], n: int) -> None:
        lengths.append(len((await engine.generate(prompt, fixed(n))).token_ids))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for prompt, n in zip(prompts, counts, strict=True):
            tg.start_soon(one, prompt, n)
    seconds = time.perf_counter() - t0
    assert sorted(lengths) == sorted(counts), (sorted(lengths), sorted(counts))
    return seconds


async def measure(
    engine: Any, renderer: ChatRenderer, tasks: list[dict[str, Any]], turns: int, min_tokens: int, max_tokens: int
) -> dict[str, Any]:
    from vllm import SamplingParams

    config = HarnessConfig(max_steps=turns, max_response_length=4096, check_alignment=False,
                           sampling={"temperature": 0.0, "min_tokens": min_tokens, "max_tokens": max_tokens})  # fmt: skip
    env = CalculatorEveryTurn(turns)

    async def one(task: dict[str, Any], idx: int) -> Any:
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    t0 = time.perf_counter()
    trajectories = await run_tasks(tasks, one, n_parallel_agents=len(tasks))
    rollout_s = time.perf_counter() - t0
    failed = [t.error for t in trajectories if t.failed]
    assert not failed, failed
    prompts = [list(t.prompt_tokens) for t in trajectories]
    counts = [int(t.metrics["generated_tokens"]) for t in trajectories]
    inserted = sum(int((t.response_masks == 0).sum()) for t in trajectories)

    facade_s = await facade_seconds(engine, prompts, counts)

    def offline(llm: Any) -> float:
        llm.reset_prefix_cache()
        params = [SamplingParams(**fixed(n)) for n in counts]
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == counts
        return time.perf_counter() - start

    offline_s = await engine.call(offline)
    total = sum(counts)
    return {
        "agents": len(tasks), "turns": turns, "sampled_tokens": total, "inserted_tokens": inserted,
        "turns_done": sum(t.metrics["steps"] for t in trajectories),
        "rollout_s": rollout_s, "facade_s": facade_s, "offline_s": offline_s,
        "rollout_tok_s": total / rollout_s, "facade_tok_s": total / facade_s, "offline_tok_s": total / offline_s,
        "utilization": offline_s / rollout_s, "facade_over_offline": offline_s / facade_s,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--agents", type=int, default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    agents = args.agents or (8 if args.quick else 64)
    turns = args.turns or (3 if args.quick else 4)
    repeats = args.repeats or (3 if args.quick else 5)
    max_tokens = args.max_tokens or 256  # SmolLM2 rarely closes a greedy turn sooner: shorter caps end it in one turn
    from transformers import AutoTokenizer

    from agentic_rl.data import load_tasks
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model

    model = resolve_model("smollm2-135m-instruct")
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(model)))
    tasks = load_tasks(DATA, agents)

    config = VLLMEngineConfig(model=model, max_model_len=4096, kv_cache_gib=1.0)

    async def run() -> list[dict[str, Any]]:
        engine = VLLMEngine(config)
        await engine.start()
        try:
            await measure(engine, renderer, tasks[:4], 1, 8, 16)  # warm up
            return [await measure(engine, renderer, tasks, turns, args.min_tokens, max_tokens) for _ in range(repeats)]
        finally:
            await engine.close()

    runs = anyio.run(run, backend_options={"use_uvloop": True})
    print(
        f"engine utilization: {agents} agents x {turns} turns, calculator after every turn, SmolLM2-135M {config.dtype}"
    )
    print(table(["run", "sampled tok", "rollout tok/s", "facade tok/s", "offline tok/s", "utilization"],
                [(i, r["sampled_tokens"], r["rollout_tok_s"], r["facade_tok_s"], r["offline_tok_s"], r["utilization"])
                 for i, r in enumerate(runs)]))  # fmt: skip
    ratios = [r["utilization"] for r in runs]
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    print(f"utilization over {len(runs)} alternating runs: median {median:.3f}, min {low:.3f}, max {high:.3f}")
    goal = verdict(
        Goal(f"utilization (median of {len(runs)})", median, ">=", 0.95), note=f"min {low:.3f}, max {high:.3f}"
    )
    save("engine_utilization", {"runs": runs, "utilization": median, "utilization_min": low, "utilization_max": high},
         args.out, args.quick, goal=goal)  # fmt: skip


if __name__ == "__main__":
    main()
