"""What a chat template that rewrites history costs: one exact run per turn against one run per trajectory.

The same conversation (a system prompt, a question, T assistant turns of reasoning plus a tool call, each answered
by a tool result) is rolled out through the harness under two templates that differ only in how they treat
history: `qwen3-coder-style.jinja` appends every turn (one run), `qwen3.5-style.jinja` opens `<think>` in the
generation prompt and drops earlier reasoning (a new run per turn, prompted with the template's render of the whole
conversation). The engine is a zero-latency stand-in that writes the same turn each time, so what differs is the
harness's work and what the trainer must forward:

- prompt tokens rendered and encoded by the harness (first prompt + appended glue, or every run's prompt);
- harness seconds per trajectory (render + encode, the environment step, bookkeeping);
- trainer tokens: the tokens of the trajectory's rows (one row per run), and what the forward passes read when the
  rows of one micro-batch share their common prefix once (`train.shared_prefix`, as `GRPOTrainer` does).

    .venv/bin/python benchmarks/template_runs.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
from common import save, table
from harness_overhead import FixedTurnsEnvironment
from sim_engine import SimulatedEngine

from agentic_rl import ChatRenderer, HarnessConfig, RolloutSpec, run_trajectory
from agentic_rl.models import resolve_model

TEMPLATES = Path(__file__).parents[1] / "tests" / "fixtures" / "templates"
APPEND, REWRITE = "qwen3-coder-style.jinja", "qwen3.5-style.jinja"
TURN = ("The calculator gives exact results, so I will ask it rather than work the product out by hand.\n</think>\n\n"
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n6 * 7\n</parameter>\n</function>\n</tool_call>")  # fmt: skip


def _renderer(template: str) -> ChatRenderer:
    from transformers import AutoTokenizer

    tok = copy.deepcopy(AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m-instruct"))))
    tok.chat_template = (TEMPLATES / template).read_text()
    return ChatRenderer(tok, history_rewrites=True)


def _forward_tokens(runs: list[Any]) -> tuple[int, int]:
    """(tokens of the rows, tokens the forwards read with the rows' common prefix computed once)."""
    rows = [run.prompt_ids + run.response_ids for run in runs]
    total = sum(len(r) for r in rows)
    shared = 0
    if len(rows) > 1:
        shortest = min(len(run.prompt_ids) for run in runs)
        while shared < shortest - 1 and all(r[shared] == rows[0][shared] for r in rows):
            shared += 1
    return total, total - shared * (len(rows) - 1)


async def _measure(template: str, turns: int, trajectories: int) -> dict[str, Any]:
    renderer = _renderer(template)
    engine = SimulatedEngine(renderer.encode(TURN), renderer.end_of_turn_id)
    config = HarnessConfig(max_steps=turns, max_prompt_length=1 << 20, max_response_length=1 << 20,
                           check_alignment=False)  # fmt: skip
    spec = RolloutSpec(engine, FixedTurnsEnvironment(turns), renderer, config)
    seconds, trajectory = [], None
    for i in range(trajectories):
        task = {"id": i, "question": f"question {i}: what is 6 times 7?", "ground_truth": "42"}
        t0 = time.perf_counter()
        trajectory = await run_trajectory(task, i, spec)
        seconds.append(time.perf_counter() - t0)
    assert trajectory is not None and not trajectory.failed, trajectory.error if trajectory else None
    runs = trajectory.runs
    inserted = sum(m == 0 for run in runs for m in run.response_mask)
    rows, read = _forward_tokens(runs)
    return {
        "template": template,
        "turns": turns,
        "runs": len(runs),
        "sampled": trajectory.num_generated_tokens,
        "prompt_tokens_encoded": sum(len(run.prompt_ids) for run in runs) + inserted,
        "harness_ms": 1000 * statistics.median(seconds),
        "row_tokens": rows,
        "forward_tokens_shared_prefix": read,
    }


async def main(args: argparse.Namespace) -> None:
    results = []
    for turns in (2, 4) if args.quick else (2, 4, 8, 16):
        for template in (APPEND, REWRITE):
            results.append(await _measure(template, turns, 5 if args.quick else 20))
    headers = ["turns", "template", "runs", "sampled", "prompt tokens encoded", "harness ms", "row tokens",
               "forward tokens (shared prefix)"]  # fmt: skip
    rows = [[r["turns"], "rewrites" if r["template"] == REWRITE else "appends", r["runs"], r["sampled"],
             r["prompt_tokens_encoded"], f"{r['harness_ms']:.1f}", r["row_tokens"], r["forward_tokens_shared_prefix"]]
            for r in results]  # fmt: skip
    print(table(headers, rows))
    ratios = []
    for append, rewrite in zip(results[::2], results[1::2], strict=True):
        ratio = {
            "turns": append["turns"],
            "encoded": rewrite["prompt_tokens_encoded"] / append["prompt_tokens_encoded"],
            "harness": rewrite["harness_ms"] / append["harness_ms"],
            "rows": rewrite["row_tokens"] / append["row_tokens"],
            "forward": rewrite["forward_tokens_shared_prefix"] / append["forward_tokens_shared_prefix"],
        }
        ratios.append(ratio)
    print(table(["turns", "encoded x", "harness x", "row tokens x", "forward tokens x (shared prefix)"],
                [[r["turns"], f"{r['encoded']:.2f}", f"{r['harness']:.2f}", f"{r['rows']:.2f}", f"{r['forward']:.2f}"]
                 for r in ratios]))  # fmt: skip
    save("template_runs", {"results": results, "ratios": ratios}, args.out, args.quick)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    anyio.run(main, parser.parse_args(), backend_options={"use_uvloop": True})
