"""`peer_verifiers.py --engine simulated`: what each harness costs per turn, on an engine that is not the bottleneck.

On the real CPU engine both harnesses wait on the same slow engine, so their ratio says little about the harnesses.
Here one `sim_engine.BatchingEngine` (a continuous-batching engine whose decode step costs `--token-cost-us`
microseconds whatever the batch size, default 20) stands in for the model: every turn it "samples" the same
calculator tool call, tokenized with the real tokenizer of `--model` (default tiny-random-smollm2, from the local
cache), closed by the end-of-turn token, with logprobs and finish_reason `stop`. Every trajectory therefore runs
exactly `--max-turns` turns (default 8) on every side, and the time left over is the harness's.

The engine is wrapped by `ToolAgentEngineWrapper(engine=..., serve=True)`, which also serves it over HTTP (our
OpenAI-compatible server) on 127.0.0.1. The same GSM8K questions then run three ways, at each number of agents in
flight (`--agents`, default 64 and 256), in an order that reverses in every other repeat:

1. `ours`: our rollout in this process (`run_tasks` over `wrapper.generate_trajectory`, as
   `generate_agent_trajectories_async` runs it, without its cap of 64 agents; `check_alignment` on, as shipped).
   Token ids in, token ids out; the trajectory records are built as it goes.
2. `ours_http`: our own tool loop on the `openai` client in a subprocess (`benchmarks/peer/ours_http.py`): each
   turn is a `/v1/chat/completions` call with the whole history, captured by the server under `X-Trajectory-Id`;
   each finished trajectory is fetched from `/v1/trajectories/{id}`. This is what HTTP costs us.
3. `verifiers`: `vf.ToolEnv.evaluate` (verifiers 0.2.1, its own venv: `bash benchmarks/setup_peer.sh`) in a
   subprocess against the same server (`benchmarks/peer/verifiers_gsm8k.py`), asking for logprobs and token ids.

Both subprocess sides are timed inside the subprocess (their loop alone, not the interpreter start-up).

Reported per side, with T = turns made, W = wall seconds, C = agents in flight, N = trajectories:
- turns/s = T / W;
- ms/turn at C = 1000 * C * W / T: how long one agent waits per turn (engine and harness);
- harness ms/turn = 1000 * (W - E) / T, where E = ceil(N / C) * max_turns * (turn tokens) * step is what the run
  would take if the harness cost nothing: the harness's serial cost per turn (one event loop and one interpreter
  lock per process do the work of every agent);
- engine busy s: the seconds of the engine's step clock with at least one request in the batch.
Ratios per repeat: ours / verifiers and ours_http / verifiers (turns/s), ours / ours_http (in-process / HTTP).
Goal: ours >= 1.5x verifiers turns/s at 64 agents (mean over repeats); every trajectory made exactly max_turns turns
on every side; every trajectory's token records agree (mask, ids and logprobs of one length; sampled tokens =
turns x turn length). Results: `benchmarks/results/peer_verifiers_sim.json` (`results/quick/` with --quick).

    bash benchmarks/setup_peer.sh        # once
    .venv/bin/python benchmarks/peer_verifiers.py --engine simulated [--quick] [--agents 64,256] [--rounds R]
        [--repeats R] [--max-turns T] [--max-tokens M] [--token-cost-us U] [--model NAME] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from typing import Any

import anyio
from common import Goal, save, table, verdict
from peer_client import DATA, HERE, PEER_VENV, run_client, run_peer
from sim_engine import BatchingEngine, tool_call_turn

OURS_HTTP = HERE / "peer" / "ours_http.py"
SIM_SIDES = ("ours", "ours_http", "verifiers")
# The first run of many agents over HTTP was measured ~40% slower than the next ones after a warm-up of 2 agents.
WARM_UP_AGENTS = 16


def build(args: argparse.Namespace) -> tuple[Any, BatchingEngine]:
    """The simulated engine and the wrapper over it (its server started)."""
    from transformers import AutoTokenizer

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.environments.tool_env import DEFAULT_SYSTEM_PROMPT
    from agentic_rl.models import resolve_model
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper
    from agentic_rl.tools.registry import build_tools

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(args.model)))
    renderer = ChatRenderer(tokenizer)
    engine = BatchingEngine(tool_call_turn(renderer), renderer.end_of_turn_id, step_s=args.token_cost_us * 1e-6,
                            max_model_len=8192)  # fmt: skip
    wrapper = ToolAgentEngineWrapper(
        "smollm2", tokenizer, {"temperature": 0.0, "max_tokens": args.max_tokens}, max_prompt_length=2048,
        max_response_length=4096, max_steps=args.max_turns, engine=engine, tools=build_tools(["calculator"]),
        system_prompt=DEFAULT_SYSTEM_PROMPT, serve=True,
    )  # fmt: skip
    wrapper.initialize()
    return wrapper, engine


def run_ours(wrapper: Any, tasks: list[dict[str, Any]], concurrency: int, turn_tokens: int) -> dict[str, Any]:
    """Our rollout in process; the counts, and whether every record's token bookkeeping agrees."""
    from agentic_rl.rollout.runner import run_tasks

    async def go() -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        trajectories = await run_tasks(tasks, wrapper.generate_trajectory, n_parallel_agents=concurrency)
        return trajectories, time.perf_counter() - t0

    trajectories, wall = anyio.run(go, backend_options={"use_uvloop": True})
    turn_counts = sorted(int(t.metrics.get("steps", 0)) for t in trajectories)
    consistent = all(
        len(t.response_tokens) == len(t.response_masks) == len(t.response_logprobs)
        and t.num_generated_tokens == int(t.metrics.get("steps", 0)) * turn_tokens
        for t in trajectories if not t.failed
    )  # fmt: skip
    return {"tasks": len(tasks), "completed": sum(not t.failed for t in trajectories),
            "errors": sorted({str(t.error)[:200] for t in trajectories if t.failed}), "turns": sum(turn_counts),
            "turn_counts": turn_counts, "generated_tokens": sum(t.num_generated_tokens for t in trajectories),
            "consistent": consistent, "wall_s": wall}  # fmt: skip


def run_ours_http(address: str, model: str, args: argparse.Namespace, system_prompt: str, tool: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Our tool loop over HTTP in a subprocess (`peer/ours_http.py`); its JSON line."""
    command = [sys.executable, str(OURS_HTTP), "--base-url", f"http://{address}/v1", "--model", model,
               "--data", str(DATA), "--tasks", str(args.tasks), "--concurrency", str(args.concurrency),
               "--max-turns", str(args.max_turns), "--max-tokens", str(args.max_tokens), "--system-prompt", system_prompt,
               "--tool-schema", json.dumps(tool)]  # fmt: skip
    return run_client(command, args.peer_timeout, "our HTTP client")


def with_rates(result: dict[str, Any], agents: int, engine: BatchingEngine, args: argparse.Namespace) -> dict[str, Any]:
    """`result` with the rates of the module's docstring (turns/s, ms/turn at C, harness ms/turn, engine busy s)."""
    turn_tokens = len(engine.tokens) + 1
    ideal = math.ceil(result["tasks"] / agents) * args.max_turns * turn_tokens * engine.step_s
    turns, wall = max(result["turns"], 1), result["wall_s"]
    counts = Counter(result["turn_counts"])  # kept as {turns: trajectories}
    return {**result, "turn_counts": {str(k): counts[k] for k in sorted(counts)}, "turns_per_s": result["turns"] / wall, "ms_per_turn_at_agents": 1e3 * agents * wall / turns,
            "harness_ms_per_turn": 1e3 * (wall - ideal) / turns, "engine_ideal_s": ideal,
            "engine_busy_s": engine.busy_s, "engine_requests": engine.requests}  # fmt: skip


def run_side(side: str, wrapper: Any, engine: BatchingEngine, tasks: list[dict[str, Any]], args: argparse.Namespace,
             agents: int) -> dict[str, Any]:  # fmt: skip
    """One side's run of `tasks` with `agents` in flight, with its rates."""
    from agentic_rl.environments.tool_env import DEFAULT_SYSTEM_PROMPT

    level = argparse.Namespace(**{**vars(args), "tasks": len(tasks), "concurrency": agents, "force_tool_calls": False})
    address, tool = wrapper.server_addresses[0], wrapper.tools[0].schema["function"]
    engine.reset_stats()
    turn_tokens = len(engine.tokens) + 1
    if side == "ours":
        result = run_ours(wrapper, tasks, agents, turn_tokens)
    elif side == "ours_http":
        result = run_ours_http(address, wrapper.agent_name, level, DEFAULT_SYSTEM_PROMPT, tool)
    else:
        result = run_peer(address, wrapper.agent_name, level, DEFAULT_SYSTEM_PROMPT, tool)
        result["consistent"] = result["turns_with_server_token_ids"] == result["turns"]
    # every sampled token of every turn is in the records, once
    result["consistent"] = result["consistent"] and result["generated_tokens"] == result["turns"] * turn_tokens
    return with_rates(result, agents, engine, args)


def measure(wrapper: Any, engine: BatchingEngine, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (agents, repeat) row: each side's run and the ratios, sides in alternating order."""
    from agentic_rl.data import load_tasks

    all_tasks = load_tasks(DATA, max(args.agents) * args.rounds)
    warm = min(WARM_UP_AGENTS, *args.agents)
    for side in SIM_SIDES:  # warm up every path (imports, the server's connections and worker threads, first renders)
        run_side(side, wrapper, engine, all_tasks[:warm], args, warm)
    rows: list[dict[str, Any]] = []
    for agents in args.agents:
        tasks = all_tasks[: agents * args.rounds]
        for repeat in range(args.repeats):
            order = SIM_SIDES if repeat % 2 == 0 else SIM_SIDES[::-1]
            row: dict[str, Any] = {"agents": agents, "repeat": repeat, "order": list(order)}
            for side in order:
                row[side] = run_side(side, wrapper, engine, tasks, args, agents)
            rate = {side: row[side]["turns_per_s"] for side in SIM_SIDES}
            row.update(ratio_ours=rate["ours"] / rate["verifiers"], ratio_ours_http=rate["ours_http"] / rate["verifiers"],
                       ratio_in_process_over_http=rate["ours"] / rate["ours_http"])  # fmt: skip
            rows.append(row)
            print(f"{agents} agents, repeat {repeat}: " + ", ".join(f"{s} {rate[s]:.0f} turns/s" for s in SIM_SIDES)
                  + f"; ours/verifiers {row['ratio_ours']:.2f}, ours_http/verifiers {row['ratio_ours_http']:.2f}, "
                  f"in-process/HTTP {row['ratio_in_process_over_http']:.2f}", flush=True)  # fmt: skip
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per number of agents: the mean over repeats of each side's rates and of each ratio."""
    out: dict[str, Any] = {}
    for agents in sorted({r["agents"] for r in rows}):
        mine = [r for r in rows if r["agents"] == agents]
        entry: dict[str, Any] = {side: {key: sum(r[side][key] for r in mine) / len(mine)
                                        for key in ("turns_per_s", "ms_per_turn_at_agents", "harness_ms_per_turn")}
                                 for side in SIM_SIDES}  # fmt: skip
        for key in ("ratio_ours", "ratio_ours_http", "ratio_in_process_over_http"):
            entry[key] = sum(r[key] for r in mine) / len(mine)
            entry[f"{key}_range"] = [min(r[key] for r in mine), max(r[key] for r in mine)]
        out[str(agents)] = entry
    return out


def report(rows: list[dict[str, Any]], args: argparse.Namespace, turn_tokens: int) -> None:
    """Print the table and the summary, check the goals and save the results."""
    headers = ["agents", "repeat", "side", "tasks", "completed", "turns", "wall s", "turns/s", "ms/turn at C",
               "harness ms/turn", "engine busy s"]  # fmt: skip
    print(f"peer (simulated engine): {turn_tokens}-token forced calculator call per turn, "
          f"{args.token_cost_us:g} us per decode step shared by the batch, {args.max_turns} turns per trajectory, "
          f"{args.rounds} trajectories per agent, tokenizer of {args.model}")  # fmt: skip
    print(table(headers, [(r["agents"], r["repeat"], side, s["tasks"], s["completed"], s["turns"], s["wall_s"],
                           s["turns_per_s"], s["ms_per_turn_at_agents"], s["harness_ms_per_turn"], s["engine_busy_s"])
                          for r in rows for side in SIM_SIDES for s in [r[side]]]))  # fmt: skip
    means = summary(rows)
    for agents, entry in means.items():
        print(f"{agents} agents (mean of {args.repeats}): ours/verifiers {entry['ratio_ours']:.2f}, "
              f"ours_http/verifiers {entry['ratio_ours_http']:.2f}, in-process/HTTP "
              f"{entry['ratio_in_process_over_http']:.2f}; harness ms/turn "
              + ", ".join(f"{s} {entry[s]['harness_ms_per_turn']:.3f}" for s in SIM_SIDES))  # fmt: skip
    off_limit = sum(n for r in rows for side in SIM_SIDES for k, n in r[side]["turn_counts"].items()
                    if int(k) != args.max_turns)  # fmt: skip
    inconsistent = sum(not r[side]["consistent"] for r in rows for side in SIM_SIDES)
    first = means[str(args.agents[0])]
    goals = [Goal(f"ours / verifiers turns/s at {args.agents[0]} agents (mean)", first["ratio_ours"], ">=", 1.5, "x", 2),
             Goal(f"trajectories not of exactly {args.max_turns} turns", off_limit, "==", 0, digits=0),
             Goal("runs whose token records disagree", inconsistent, "==", 0, digits=0)]  # fmt: skip
    note = ", ".join(f"{a} agents: ours/verifiers {e['ratio_ours']:.2f}, in-process/HTTP "
                     f"{e['ratio_in_process_over_http']:.2f}" for a, e in means.items())  # fmt: skip
    save("peer_verifiers_sim", {
        "engine": "simulated", "token_cost_us": args.token_cost_us, "turn_tokens": turn_tokens, "agents": args.agents,
        "rounds": args.rounds, "repeats": args.repeats, "max_turns": args.max_turns, "max_tokens": args.max_tokens,
        "model": args.model, "summary": means, "runs": rows, "trajectories_not_of_max_turns": off_limit,
    }, args.out, args.quick, goal=verdict(*goals, note=note))  # fmt: skip


def main(args: argparse.Namespace) -> None:
    """Run the simulated-engine mode with `peer_verifiers.py`'s parsed arguments."""
    if not (PEER_VENV / "bin" / "python").exists():
        sys.exit(f"no peer venv at {PEER_VENV}: run `bash benchmarks/setup_peer.sh` (or set PEER_VENV)")
    args.agents = [int(a) for a in str(args.agents).split(",")]
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.repeats = args.repeats or 2
    args.max_turns = args.max_turns or 8
    args.max_tokens = args.max_tokens or 64
    args.model = args.model or "tiny-random-smollm2"
    wrapper, engine = build(args)
    try:
        rows = measure(wrapper, engine, args)
    finally:
        anyio.run(wrapper.close)
    report(rows, args, len(engine.tokens) + 1)
