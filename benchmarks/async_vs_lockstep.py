"""Async rollout vs a lockstep batched loop: the same engine, tasks, tools and tool latencies, side by side.

Every trajectory is a coroutine in our rollout, so a slow tool call or a long generation in one trajectory does not
hold back the others. The classic batched multi-turn loop (as in verl's earlier multi-turn rollout) runs in
lockstep instead: each turn, all active trajectories generate together, then all their tool calls run
concurrently, and the next turn starts only when the last tool call of the batch returned.

Both sides run the same work, one after the other in one process, on uvloop:

- `ours`: `run_tasks` / `run_trajectory`, as `agentic-rl rollout` runs them (alignment check on, as shipped).
- `lockstep`: the batched loop below, with concurrent generation of the whole batch and concurrent tool calls,
  on the same engine object, environment and `ChatRenderer` token bookkeeping; its token ids are checked to equal
  ours, trajectory by trajectory.

The engine is `harness_overhead.SimulatedEngine` (a turn of n tokens submitted with c requests in flight takes
n x (10 ms + 0.1 ms x c): continuous batching that slows as the batch grows), so the numbers repeat on a noisy
machine. Trajectory i has T_i turns (4 to 8, seeded); after every turn but the last, a tool call takes
`latency(i, t)` seconds, drawn from a lognormal with median 0.2 s: sigma 0 (always 0.2 s), a moderate tail (p99
1 s) and the heavy tail of sandboxes and web search (p99 3 s). The draw is a function of (seed, i, t) only, so
both sides wait the same latencies.

speedup = lockstep wall / ours. Beside it, two predictions from a timing model that ignores the harness and gives
every generation the latency of a full batch (pessimistic for ours, whose in-flight count drops while others wait
on tools):

- lockstep = sum over turns t of (generation at the batch's size + the slowest tool call of turn t),
- ours = the longest trajectory, sum over its turns of (generation at full batch + its own tool calls),

`model` evaluates it on the latencies drawn for the run; `expected` averages it over 2,000 fresh draws
(what the distribution predicts rather than this seed).

    .venv/bin/python benchmarks/async_vs_lockstep.py [--quick] [--seed S] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import anyio
import numpy as np
from common import Goal, save, table, verdict
from harness_overhead import FixedTurnsEnvironment, SimulatedEngine, make_tasks, smollm2_turn, timed_rollout

from agentic_rl import ChatRenderer, Sample, SamplingConfig, StepResult
from agentic_rl.engine.turns import TurnEnd, read_turn

MEDIAN_S = 0.2
Z99 = NormalDist().inv_cdf(0.99)
SPREADS = {"fixed": 0.0, "moderate": math.log(1.0 / MEDIAN_S) / Z99, "heavy": math.log(3.0 / MEDIAN_S) / Z99}
MIN_TURNS, MAX_TURNS = 4, 8
BASE_S, PER_REQUEST_S = 0.01, 0.0001  # as in harness_overhead.py


@dataclass(frozen=True)
class Workload:
    """Turns per trajectory and tool latencies: deterministic functions of (seed, trajectory, turn)."""

    sigma: float
    seed: int = 0

    def turns(self, task: int) -> int:
        return random.Random(f"turns/{self.seed}/{task}").randint(MIN_TURNS, MAX_TURNS)

    def latency(self, task: int, turn: int) -> float:
        return MEDIAN_S * math.exp(self.sigma * random.Random(f"latency/{self.seed}/{task}/{turn}").gauss(0.0, 1.0))


class SlowToolEnvironment(FixedTurnsEnvironment):
    """Task i ends after `workload.turns(i)` assistant turns; every turn before calls a tool of `latency(i, turn)`."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(MAX_TURNS)
        self.workload = workload

    async def step(self, sample: Sample) -> StepResult:
        task = sample.task["id"]
        turn = sum(m["role"] == "assistant" for m in sample.messages) - 1
        if turn + 1 >= self.workload.turns(task):
            return StepResult([], True, {})
        await anyio.sleep(self.workload.latency(task, turn))
        return StepResult([{"role": "tool", "content": f"result {turn}: 42"}], False, {"tool_calls": 1})


async def lockstep(
    engine: SimulatedEngine, renderer: ChatRenderer, env: SlowToolEnvironment, tasks: list[dict[str, Any]]
) -> tuple[list[list[int]], float]:
    """The batched loop: each turn, every active trajectory generates, then every tool call runs, all concurrently;
    the next turn waits for the whole batch. Returns each trajectory's token ids (prompt and response) and the wall
    seconds."""
    t0 = time.perf_counter()
    sampling = SamplingConfig(max_tokens=64, stop_token_ids=[renderer.end_of_turn_id])
    samples = [await env.reset({**task, "trajectory_id": f"{task['id']}-{i}"}) for i, task in enumerate(tasks)]
    ids = [renderer.prompt_ids(s.messages, s.tools) for s in samples]
    ends: dict[int, TurnEnd] = {}
    results: dict[int, StepResult] = {}

    async def generate(i: int) -> None:
        generation = await engine.generate(ids[i], sampling)
        ends[i] = end = read_turn(generation, renderer)
        ids[i] += [*generation.token_ids[: end.kept], *end.tail_ids]
        samples[i].messages.append({"role": "assistant", "content": end.content})

    async def step(i: int) -> None:
        results[i] = await env.step(samples[i])

    active = list(range(len(tasks)))
    while active:
        for phase in (generate, step):
            async with anyio.create_task_group() as tg:
                for i in active:
                    tg.start_soon(phase, i)
        still = []
        for i in active:
            if results[i].done:
                continue
            obs_ids = renderer.observation_ids(results[i].observation, samples[i].tools)
            ids[i] += obs_ids if ends[i].closed else [renderer.end_of_turn_id, *obs_ids]
            samples[i].messages.extend(results[i].observation)
            still.append(i)
        active = still
    for sample in samples:
        await env.close(sample)
    return ids, time.perf_counter() - t0


def predict(turns: np.ndarray, latencies: np.ndarray, gen_s: np.ndarray) -> np.ndarray:
    """The timing model's lockstep / ours for latency draws `latencies` (draws x agents x turns; NaN where no tool
    call); `turns` per agent; `gen_s[c]`: a turn's generation time with c requests in flight."""
    agents = len(turns)
    tools = np.nan_to_num(latencies)
    lock = gen_s[(turns[None, :] > np.arange(MAX_TURNS)[:, None]).sum(axis=1)].sum() + tools.max(axis=1).sum(axis=1)
    ours = (turns * gen_s[agents] + tools.sum(axis=2)).max(axis=1)
    return lock / ours


def run_case(
    renderer: ChatRenderer, tokens: list[int], agents: int, spread: str, seed: int, ours_first: bool
) -> dict[str, Any]:
    engine = SimulatedEngine(tokens, renderer.end_of_turn_id, BASE_S, PER_REQUEST_S)
    workload = Workload(SPREADS[spread], seed)
    env = SlowToolEnvironment(workload)
    tasks = make_tasks(agents)
    options = {"backend_options": {"use_uvloop": True}}
    walls: dict[str, float] = {}
    for side in ("ours", "lockstep") if ours_first else ("lockstep", "ours"):
        if side == "ours":
            trajs, walls["ours"] = anyio.run(timed_rollout, engine, renderer, env, tasks, MAX_TURNS, True, **options)
        else:
            lock_ids, walls["lockstep"] = anyio.run(lockstep, engine, renderer, env, tasks, **options)
    ours_ids = [[*t.prompt_tokens.tolist(), *t.response_tokens.tolist()] for t in trajs]
    assert ours_ids == lock_ids, "the two loops must produce the same token ids"
    turns = np.array([workload.turns(i) for i in range(agents)])
    assert [t.metrics["steps"] for t in trajs] == turns.tolist()
    gen_s = np.array([(len(tokens) + 1) * engine.token_latency(c) if c else 0.0 for c in range(agents + 1)])
    drawn = np.array(
        [[workload.latency(i, t) if t < turns[i] - 1 else np.nan for t in range(MAX_TURNS)] for i in range(agents)]
    )
    rng = np.random.default_rng(seed)
    fresh = MEDIAN_S * np.exp(SPREADS[spread] * rng.standard_normal((2000, agents, MAX_TURNS)))
    fresh[:, np.arange(MAX_TURNS)[None, :] >= turns[:, None] - 1] = np.nan
    return {
        "agents": agents, "spread": spread, "sigma": SPREADS[spread], "p99_s": MEDIAN_S * math.exp(SPREADS[spread] * Z99),
        "turns": int(turns.sum()), "tool_calls": int((turns - 1).sum()), "max_tool_s": float(np.nanmax(drawn, initial=0.0)),
        "sampled_tokens": sum(int(t.metrics["generated_tokens"]) for t in trajs),
        "alignment_mismatches": sum(int(t.metrics.get("alignment_mismatches", 0)) for t in trajs),
        "ours_s": walls["ours"], "lockstep_s": walls["lockstep"], "speedup": walls["lockstep"] / walls["ours"],
        "model_speedup": float(predict(turns, drawn[None], gen_s)[0]), "expected_speedup": float(predict(turns, fresh, gen_s).mean()),
        "order": "ours first" if ours_first else "lockstep first",
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 and 64 agents, fixed and heavy-tailed latency")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    renderer, tokens = smollm2_turn()
    agent_counts = (8, 64) if args.quick else (8, 32, 64)
    spreads = ("fixed", "heavy") if args.quick else tuple(SPREADS)
    run_case(renderer, tokens, 4, "fixed", args.seed + 1, True)  # warm up both loops
    rows = []
    for n, (spread, agents) in enumerate((s, a) for s in spreads for a in agent_counts):
        rows.append(run_case(renderer, tokens, agents, spread, args.seed, ours_first=n % 2 == 0))
        r = rows[-1]
        print(f"{spread} tail, {agents} agents: ours {r['ours_s']:.2f} s, lockstep {r['lockstep_s']:.2f} s, "
              f"speedup {r['speedup']:.2f}x (model {r['model_speedup']:.2f}x)", flush=True)  # fmt: skip
    print(f"async vs lockstep: {MIN_TURNS}-{MAX_TURNS} turns of {len(tokens) + 1} tokens per trajectory, "
          f"{BASE_S * 1e3:g} ms + {PER_REQUEST_S * 1e3:g} ms x in-flight per token, tool latency lognormal median "
          f"{MEDIAN_S:g} s, seed {args.seed}")  # fmt: skip
    print(table(["tail", "sigma", "p99 s", "agents", "tool calls", "max tool s", "ours s", "lockstep s", "speedup", "model", "expected"],
                [(r["spread"], r["sigma"], f"{r['p99_s']:.2f}", r["agents"], r["tool_calls"], r["max_tool_s"], r["ours_s"],
                  r["lockstep_s"], f"{r['speedup']:.2f}x", f"{r['model_speedup']:.2f}x", f"{r['expected_speedup']:.2f}x")
                 for r in rows]))  # fmt: skip
    target = next(r for r in rows if r["agents"] == 64 and r["spread"] == "heavy")
    goal = verdict(Goal("speedup at 64 agents, heavy tail", target["speedup"], ">=", 1.5, "x", 2),
                   note=f"model {target['model_speedup']:.2f}x, expected {target['expected_speedup']:.2f}x")  # fmt: skip
    save("async_vs_lockstep", {"median_s": MEDIAN_S, "min_turns": MIN_TURNS, "max_turns": MAX_TURNS, "base_s": BASE_S,
                               "per_request_s": PER_REQUEST_S, "tokens_per_turn": len(tokens) + 1, "seed": args.seed,
                               "rows": rows, "speedup": target["speedup"]}, args.out, args.quick, goal=goal)  # fmt: skip


if __name__ == "__main__":
    main()
