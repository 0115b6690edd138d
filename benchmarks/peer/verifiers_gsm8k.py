"""Peer side of `benchmarks/peer_verifiers.py`: GSM8K through a `verifiers` multi-turn tool environment.

Runs in the peer virtual environment (`benchmarks/setup_peer.sh`), never in the project's: it builds a classic
`vf.ToolEnv` over a calculator function, points an `AsyncOpenAI` client at our OpenAI-compatible server, runs
`env.evaluate(...)` and prints one JSON line with the counts and the wall time of `evaluate` alone (imports, dataset
and environment construction are not timed).

    $PEER_VENV/bin/python benchmarks/peer/verifiers_gsm8k.py --base-url http://127.0.0.1:PORT/v1 --model NAME \
        --data ../shared/data/gsm8k_test.jsonl --tasks 16 --concurrency 16 --max-turns 3 --max-tokens 256 \
        [--tool-choice required --no-parallel-tool-calls]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import logging
import operator
import re
import time

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(f"not allowed in an arithmetic expression: {type(node).__name__}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses; returns the number.

    Args:
        expression: The arithmetic expression, e.g. (16 - 3 - 4) * 2
    """
    cleaned = expression.replace(",", "").replace("$", "").replace("^", "**")
    value = _value(ast.parse(cleaned.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def _last_number(text: str) -> str | None:
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", text or "")
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def correct(completion, answer: str) -> float:
    """1.0 when the last number of the final assistant message equals the GSM8K answer (after '####'); 0.0 when
    that message calls a tool."""
    final = [
        m
        for m in completion
        if getattr(m, "role", None) == "assistant" or (isinstance(m, dict) and m.get("role") == "assistant")
    ]
    if not final:
        return 0.0
    last = final[-1]
    if last.get("tool_calls") if isinstance(last, dict) else getattr(last, "tool_calls", None):
        return 0.0  # cut while still calling tools: no answer (as our rewards grade it)
    content = last["content"] if isinstance(last, dict) else last.content
    got, want = _last_number(content if isinstance(content, str) else ""), _last_number(answer.split("####")[-1])
    try:
        return float(got is not None and want is not None and float(got) == float(want))
    except ValueError:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--tasks", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--max-turns", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--system-prompt", required=True)
    parser.add_argument("--tool-schema", default=None, help="JSON {name, description, parameters} to offer instead")
    parser.add_argument("--tool-choice", default=None, help="OpenAI tool_choice of every request, e.g. required")
    parser.add_argument("--no-parallel-tool-calls", action="store_true", help="send parallel_tool_calls=false")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    rows = []
    with open(args.data, encoding="utf-8") as f:
        for line in f:
            if line.strip() and len(rows) < args.tasks:
                row = json.loads(line)
                rows.append({"question": row["question"], "answer": str(row.get("ground_truth", row.get("answer")))})
    env = vf.ToolEnv(
        eval_dataset=Dataset.from_list(rows), system_prompt=args.system_prompt, tools=[calculator],
        max_turns=args.max_turns, rubric=vf.Rubric(funcs=[correct]),
    )  # fmt: skip
    if args.tool_schema:  # the rollout side's exact schema, so that both render the same system prompt
        env.tool_defs = [vf.Tool(**json.loads(args.tool_schema))]
    client = OpenAIChatCompletionsClient(
        AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=3600)
    )
    # `logprobs` makes verifiers keep the server's prompt and completion token ids per turn (our server returns
    # `prompt_token_ids` and `choices[].token_ids`).
    # verifiers renames `max_tokens` to OpenAI's `max_completion_tokens`, which our server does not read (it would
    # fall back to its default of 128): `extra_body` sends `max_tokens` as it is.
    sampling = {"temperature": args.temperature, "logprobs": True, "extra_body": {"max_tokens": args.max_tokens}}
    # verifiers sends sampling args as they are: `tool_choice="required"` makes our server constrain every turn to
    # tool calls (one per turn with `parallel_tool_calls=false`), so the loop runs to `max_turns`.
    if args.tool_choice:
        sampling["tool_choice"] = args.tool_choice
    if args.no_parallel_tool_calls:
        sampling["parallel_tool_calls"] = False
    t0 = time.perf_counter()
    results = asyncio.run(env.evaluate(
        client=client, model=args.model, sampling_args=sampling, num_examples=len(rows), rollouts_per_example=1,
        max_concurrent=args.concurrency, state_columns=["trajectory"], on_progress=lambda *a, **k: None,
    ))  # fmt: skip
    wall = time.perf_counter() - t0
    outputs = results["outputs"]
    steps = [step for out in outputs for step in (out.get("trajectory") or [])]
    with_ids = [s for s in steps if s.get("tokens") and s["tokens"].get("completion_ids") is not None]
    first_prompts = [len(out["trajectory"][0]["tokens"]["prompt_ids"]) for out in outputs
                     if out.get("trajectory") and out["trajectory"][0].get("tokens")]  # fmt: skip
    usage_tokens = sum(int((out.get("token_usage") or {}).get("output_tokens", 0)) for out in outputs)
    print(json.dumps({
        "verifiers_version": vf.__version__,
        "tasks": len(rows),
        "completed": sum(1 for out in outputs if out.get("is_completed") and not out.get("error")),
        "errors": sorted({str(out["error"].get("error_chain_repr", out["error"]))[:300] for out in outputs
                          if out.get("error")}),
        "turns": len(steps),
        "turn_counts": sorted(len(out.get("trajectory") or []) for out in outputs),
        "tool_calls": sum(len(m.get("tool_calls") or []) for out in outputs for m in (out.get("completion") or [])
                          if isinstance(m, dict) and m.get("role") == "assistant"),
        "generated_tokens": sum(len(s["tokens"]["completion_ids"]) for s in with_ids) if with_ids else usage_tokens,
        "usage_completion_tokens": usage_tokens,
        "turns_with_server_token_ids": len(with_ids),
        "mean_first_prompt_tokens": sum(first_prompts) / len(first_prompts) if first_prompts else None,
        "accuracy": sum(out.get("reward", 0.0) for out in outputs) / max(len(outputs), 1),
        "wall_s": wall,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
