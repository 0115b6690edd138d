"""GSM8K with a calculator tool through the Python API, with a custom reward shaping.

Run from the repository root after `bash scripts/setup.sh`:

    .venv/bin/python examples/gsm8k_calculator.py --limit 8
"""

from __future__ import annotations

import argparse
import json
import logging

import anyio
from transformers import AutoTokenizer

from agentic_rl import CalculatorTool, ToolAgentEngineWrapper, final_answer_text, gsm8k_reward, resolve_model


def reward_with_format(task, messages):
    """GSM8K correctness, plus a small bonus for ending on a line that is just the number."""
    correct = gsm8k_reward(task, messages)
    answer = final_answer_text(messages).strip()  # "" when the trajectory ended on a tool call or its result
    last_line = answer.splitlines()[-1] if answer else ""
    return correct + (0.1 if last_line.replace(",", "").replace(".", "", 1).isdigit() else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data/gsm8k_test.jsonl")
    parser.add_argument("--limit", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    model = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model)
    with open(args.data) as f:
        rows = [json.loads(line) for _, line in zip(range(args.limit), f, strict=False)]
    tasks = [{"id": i, "question": r["question"], "ground_truth": r["answer"]} for i, r in enumerate(rows)]

    wrapper = ToolAgentEngineWrapper(
        "gsm8k_calculator", tokenizer, {"temperature": 0.7, "max_tokens": 256, "seed": 0},
        max_prompt_length=1024, max_response_length=768, n_parallel_agents=8, max_steps=3,
        model=model, tools=[CalculatorTool()], reward_fn=reward_with_format,
        engine_options={"kv_cache_gib": 0.5},
    )  # fmt: skip
    wrapper.initialize()

    async def run():
        try:
            return await wrapper.generate_agent_trajectories_async(tasks)
        finally:
            await wrapper.close()

    for t in anyio.run(run):
        print(f"task {t.idx}: reward={t.trajectory_reward:.2f} turns={t.metrics['steps']} "
              f"sampled={t.num_generated_tokens} inserted={len(t.response_tokens) - t.num_generated_tokens} "
              f"end={t.termination_reason}")  # fmt: skip


if __name__ == "__main__":
    main()
