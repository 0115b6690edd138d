"""Peer: the `verifiers` multi-turn tool environment through our OpenAI server vs our own rollout, in one run.

One in-process vLLM engine (SmolLM2-135M-Instruct, the platform's dtype: fp32 on CPUs without native bf16) is wrapped by `ToolAgentEngineWrapper(serve=True)`, which
also serves it over HTTP (OpenAI API) on 127.0.0.1. The same GSM8K questions then run both ways, back to back,
reversing the order in every other repeat:

1. `verifiers`: a subprocess in its own virtual environment (`bash benchmarks/setup_peer.sh`, verifiers 0.2.1)
   runs a classic `vf.ToolEnv` over a calculator function with `env.evaluate(...)` against our server
   (`benchmarks/peer/verifiers_gsm8k.py`). Per turn: the client sends the whole chat history as JSON over HTTP;
   the server validates it, re-renders the chat template over the full history, tokenizes, generates, decodes,
   parses tool calls into OpenAI `tool_calls`, and answers in JSON; the client parses that and runs the tool.
   Its time is that of `evaluate` alone (imports and environment set-up are not timed).
2. `ours`: `wrapper.generate_agent_trajectories_async(tasks)` on the same engine. Per turn: token ids in, token
   ids out; only the new observation is templated and appended, plus, as shipped (`check_alignment=True`), one
   full re-render of the finished trajectory to verify its ids.
3. `ours_no_check`: the same with `check_alignment=False` (verifiers runs no such check).

Both sides get the same questions, system prompt and calculator schema (tools described in the system prompt by
the same function, since SmolLM2's template ignores `tools`), greedy sampling, the same `max_tokens` per turn, the
same limit on assistant turns and the same number of trajectories in flight. tokens/s counts the completion
tokens the engine sampled (verifiers: the token ids our server returned per turn; ours: the trajectory's sampled
ids); ratio = ours / verifiers tokens/s. SmolLM2-135M rarely writes tool calls, so most trajectories are one turn.

`--force-tool-calls` (the default with `--model tiny-random-smollm2`) makes every assistant turn exactly one
calculator call on both sides, with one grammar: verifiers sends `tool_choice="required"` and
`parallel_tool_calls=false`, which our server turns into a structured-output constraint; our rollout samples under
the same constraint (`agentic_rl.server.constraints.tool_choice_outputs`, in `SamplingConfig.structured_outputs`).
Every trajectory then runs exactly `--max-turns` turns (default 8 in this mode), each observation being the
calculator's answer (mostly an error: the expressions are random). The calculator schema both sides see caps
`expression` at `EXPRESSION_MAX_CHARS` characters, so that each call closes (~50 tokens a turn). The tiny model's random weights make the engine
~10x faster, so the per-turn cost of each path (HTTP + JSON + full re-render vs ids in / ids out) shows. Both
sides' turns per trajectory are reported, and the run checks that all trajectories made exactly `--max-turns`.

    bash benchmarks/setup_peer.sh        # once: PEER_VENV (default /tmp/venv-verifiers-0.2.1)
    .venv/bin/python benchmarks/peer_verifiers.py [--quick] [--model NAME] [--tasks N] [--concurrency C] [--repeats R]
        [--max-turns T] [--max-tokens M] [--force-tool-calls | --no-force-tool-calls] [--out FILE]

`--engine simulated` measures the harnesses instead, on a fast simulated batching engine that forces a tool call
every turn, with our rollout also run over HTTP (`peer_sim.py`; results in `peer_verifiers_sim.json`).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import anyio
from common import Goal, save, table, verdict
from peer_client import DATA, PEER_VENV, run_peer

SIDES = ("verifiers", "ours", "ours_no_check")
# With forced calls, the calculator's `expression` is capped (`maxLength` in the schema both sides render and are
# constrained by): a random model's greedy string would otherwise never close, and every turn would be cut.
EXPRESSION_MAX_CHARS = 16


def run_ours(wrapper: Any, tasks: list[dict[str, Any]], check_alignment: bool = True) -> dict[str, Any]:
    """Our rollout of `tasks` on the wrapper's engine (`check_alignment`: the end-of-trajectory re-render check)."""
    wrapper.harness_config.check_alignment = check_alignment

    async def go() -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        trajectories = await wrapper.generate_agent_trajectories_async(tasks)
        return trajectories, time.perf_counter() - t0

    trajectories, wall = anyio.run(go, backend_options={"use_uvloop": True})
    ok = [t for t in trajectories if not t.failed]
    generated = sum(t.num_generated_tokens for t in trajectories)
    turn_counts = sorted(int(t.metrics.get("steps", 0)) for t in trajectories)
    return {
        "tasks": len(tasks), "completed": len(ok), "errors": sorted({str(t.error)[:200] for t in trajectories if t.failed}),
        "turns": sum(turn_counts), "turn_counts": turn_counts, "turns_per_trajectory": sum(turn_counts) / len(tasks),
        "tool_calls": sum(int(t.metrics.get("tool_calls", 0)) for t in ok), "generated_tokens": generated,
        "mean_first_prompt_tokens": sum(len(t.prompt_tokens) for t in ok) / max(len(ok), 1),
        "accuracy": sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories) / len(trajectories),
        "wall_s": wall, "tokens_per_s": generated / wall, "trajectories_per_s": len(tasks) / wall,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--model", default=None, help="default smollm2-135m-instruct; also: tiny-random-smollm2 "
                        "(fast engine; the tokenizer of --engine simulated, its default)")
    parser.add_argument("--engine", choices=("vllm", "simulated"), default="vllm",
                        help="simulated: a fast batching engine that forces a tool call every turn (see peer_sim.py)")
    parser.add_argument("--token-cost-us", type=float, default=20.0, help="simulated: microseconds per decode step")
    parser.add_argument("--agents", default="64,256", help="simulated: agents in flight, comma-separated")
    parser.add_argument("--rounds", type=int, default=None, help="simulated: trajectories per agent (default 2, quick 1)")
    parser.add_argument("--max-turns", type=int, default=None, help="default 8 with --force-tool-calls, else 3")
    parser.add_argument("--force-tool-calls", action=argparse.BooleanOptionalAction, default=None,
                        help="every turn is one calculator call, on both sides (default: on for tiny-random-smollm2)")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--peer-timeout", type=float, default=3600.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.engine == "simulated":
        import peer_sim

        return peer_sim.main(args)
    args.model = args.model or "smollm2-135m-instruct"
    args.tasks = args.tasks or (16 if args.quick else 64)
    args.concurrency = args.concurrency or (16 if args.quick else 32)
    args.repeats = args.repeats or 2
    args.max_tokens = args.max_tokens or (64 if args.quick else 256)
    if args.force_tool_calls is None:
        args.force_tool_calls = args.model == "tiny-random-smollm2"
    args.max_turns = args.max_turns or (8 if args.force_tool_calls else 3)
    if not (PEER_VENV / "bin" / "python").exists():
        sys.exit(f"no peer venv at {PEER_VENV}: run `bash benchmarks/setup_peer.sh` (or set PEER_VENV)")
    from transformers import AutoTokenizer

    from agentic_rl.data import load_tasks
    from agentic_rl.environments.tool_env import DEFAULT_SYSTEM_PROMPT
    from agentic_rl.models import resolve_model
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper
    from agentic_rl.server.constraints import tool_choice_outputs
    from agentic_rl.tools.registry import build_tools

    model = resolve_model(args.model)
    tasks = load_tasks(DATA, args.tasks)
    tools = build_tools(["calculator"])
    if args.force_tool_calls:  # both sides see (and are constrained by) this schema; see EXPRESSION_MAX_CHARS
        parameters = copy.deepcopy(tools[0].parameters)
        parameters["properties"]["expression"]["maxLength"] = EXPRESSION_MAX_CHARS
        tools[0].parameters = parameters
    sampling: dict[str, Any] = {"temperature": 0.0, "max_tokens": args.max_tokens}
    if args.force_tool_calls:  # the constraint our server builds for tool_choice="required", parallel_tool_calls=false
        sampling["structured_outputs"] = tool_choice_outputs([t.schema for t in tools], "required",
                                                             parallel_tool_calls=False)  # fmt: skip
    wrapper = ToolAgentEngineWrapper(
        "smollm2", AutoTokenizer.from_pretrained(str(model)), sampling,
        max_prompt_length=2048, max_response_length=2048, n_parallel_agents=args.concurrency,
        max_steps=args.max_turns, model=model, tools=tools, system_prompt=DEFAULT_SYSTEM_PROMPT,
        engine_options={"kv_cache_gib": 1.0, "max_model_len": 4096}, serve=True,  # the platform's dtype
    )  # fmt: skip
    wrapper.initialize()
    dtype = wrapper.engines[0].config.dtype
    address = wrapper.server_addresses[0]
    tool = wrapper.tools[0].schema["function"]
    runs: list[dict[str, Any]] = []
    try:
        warm = argparse.Namespace(**{**vars(args), "tasks": 2, "concurrency": 2, "max_tokens": 8})
        run_peer(address, wrapper.agent_name, warm, DEFAULT_SYSTEM_PROMPT, tool)  # warm up both paths
        run_ours(wrapper, tasks[:2])
        for repeat in range(args.repeats):
            order = SIDES if repeat % 2 == 0 else SIDES[::-1]
            row: dict[str, Any] = {"repeat": repeat, "order": list(order)}
            for side in order:
                if side == "verifiers":
                    row[side] = run_peer(address, wrapper.agent_name, args, DEFAULT_SYSTEM_PROMPT, tool)
                else:
                    row[side] = run_ours(wrapper, tasks, check_alignment=side == "ours")
            for side in SIDES[1:]:
                row[f"ratio_{side}"] = row[side]["tokens_per_s"] / row["verifiers"]["tokens_per_s"]
                row[f"ratio_{side}_trajectories"] = (
                    row[side]["trajectories_per_s"] / row["verifiers"]["trajectories_per_s"]
                )
            runs.append(row)
            print(f"repeat {repeat}: " + ", ".join(f"{side} {row[side]['tokens_per_s']:.1f} tok/s, "
                                                   f"{row[side]['turns_per_trajectory']:.2f} turns/traj" for side in SIDES)
                  + ", ratios " + ", ".join(f"{row[f'ratio_{side}']:.2f}" for side in SIDES[1:]), flush=True)  # fmt: skip
    finally:
        anyio.run(wrapper.close)
    headers = ["repeat", "side", "tasks", "completed", "turns", "turns/traj", "tool calls", "1st prompt tok",
               "gen tokens", "wall s", "tok/s", "traj/s"]  # fmt: skip
    rows = [(r["repeat"], side, s["tasks"], s["completed"], s["turns"], s["turns_per_trajectory"], s["tool_calls"],
             s["mean_first_prompt_tokens"], s["generated_tokens"], s["wall_s"], s["tokens_per_s"],
             s["trajectories_per_s"]) for r in runs for side in SIDES for s in [r[side]]]  # fmt: skip
    forced = "every turn one forced calculator call (tool_choice=required), " if args.force_tool_calls else ""
    print(f"peer: verifiers {runs[0]['verifiers']['verifiers_version']} ToolEnv over our server vs our rollout; "
          f"{args.tasks} GSM8K tasks, {args.concurrency} in flight, {forced}<= {args.max_turns} turns of "
          f"<= {args.max_tokens} tokens, greedy, {args.model} {dtype}")  # fmt: skip
    print(table(headers, rows))
    ratios = {side: [r[f"ratio_{side}"] for r in runs] for side in SIDES[1:]}
    for side, values in ratios.items():
        print(f"ratio {side} / verifiers (tokens/s): " + ", ".join(f"{x:.2f}" for x in values))
    # Same work on both sides: each repeat's sides made the same turns, trajectory by trajectory (as sorted counts).
    same_turns = all(r[side]["turn_counts"] == r["verifiers"]["turn_counts"] for r in runs for side in SIDES[1:])
    off_limit = sum(n != args.max_turns for r in runs for side in SIDES for n in r[side]["turn_counts"])
    turns_per_trajectory = {side: sum(r[side]["turns_per_trajectory"] for r in runs) / len(runs) for side in SIDES}
    print("turns per trajectory (mean over repeats): "
          + ", ".join(f"{side} {v:.2f}" for side, v in turns_per_trajectory.items())
          + f"; same turn counts on every side: {same_turns}")  # fmt: skip
    goals = [Goal("ours / verifiers tokens/s (mean)", sum(ratios["ours"]) / len(runs), ">=", 1.5, "x", 2)]
    if args.force_tool_calls:
        goals.append(Goal(f"trajectories not of exactly {args.max_turns} turns", off_limit, "==", 0, digits=0))
    save("peer_verifiers", {
        "tasks": args.tasks, "concurrency": args.concurrency, "max_turns": args.max_turns, "max_tokens": args.max_tokens,
        "sampling": {"temperature": 0.0}, "dtype": dtype, "force_tool_calls": args.force_tool_calls, "model": args.model, "runs": runs,
        "ratio_tokens_per_s": sum(ratios["ours"]) / len(runs), "ratio_tokens_per_s_min": min(ratios["ours"]),
        "ratio_no_alignment_check_tokens_per_s": sum(ratios["ours_no_check"]) / len(runs),
        "turns_per_trajectory": turns_per_trajectory, "same_turn_counts": same_turns,
        "trajectories_not_of_max_turns": off_limit,
        "verifiers_used_server_token_ids": all(r["verifiers"]["turns_with_server_token_ids"] == r["verifiers"]["turns"] for r in runs),
    }, args.out, args.quick, goal=verdict(*goals, note=f"ratio range {min(ratios['ours']):.2f}-{max(ratios['ours']):.2f}"))  # fmt: skip


if __name__ == "__main__":
    main()
