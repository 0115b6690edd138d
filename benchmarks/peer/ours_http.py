"""Our own agent loop over HTTP for `benchmarks/peer_verifiers.py --engine simulated`: GSM8K tool trajectories
through our OpenAI-compatible server, captured there as trainable trajectories.

Runs as a subprocess (with the project's interpreter), as the `verifiers` peer does, so that client and server do
not share one interpreter lock. Each trajectory is a plain tool loop on the `openai` client: one
`/v1/chat/completions` call per turn with the whole chat history, tagged with the `X-Trajectory-Id` header (the
server captures the call's token ids and logprobs), the calculator run on every tool call, until `--max-turns`
turns or a turn without a tool call; then `GET /v1/trajectories/{id}?pop=true` fetches the captured trajectory
(prompt and response ids, response mask, logprobs), which is what a trainer needs. Prints one JSON line with the
counts, whether every captured record's lengths agree, and the wall time of the loop alone (imports and data
loading are not timed).

    .venv/bin/python benchmarks/peer/ours_http.py --base-url http://127.0.0.1:PORT/v1 --model NAME \
        --data ../shared/data/gsm8k_test.jsonl --tasks 64 --concurrency 64 --max-turns 8 --max-tokens 64 \
        --system-prompt "..." --tool-schema '{"name": ..., "description": ..., "parameters": ...}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from openai import AsyncOpenAI
from verifiers_gsm8k import calculator


def tool_result(arguments: str) -> str:
    """The calculator's answer to one call's JSON arguments, or the error as text (the model reads either)."""
    try:
        return calculator(str(json.loads(arguments).get("expression", "")))
    except Exception as exc:  # a bad expression is an observation, not a failure
        return f"Error: {exc}"


async def trajectory(client: Any, args: argparse.Namespace, question: str, tool: dict[str, Any]) -> dict[str, Any]:
    """One tool loop; the numbers of its captured record."""
    tid = f"ours-http-{uuid.uuid4().hex[:16]}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": args.system_prompt},
                                      {"role": "user", "content": question}]  # fmt: skip
    turns = 0
    for _ in range(args.max_turns):
        response = await client.chat.completions.create(
            model=args.model, messages=messages, tools=[tool], max_tokens=args.max_tokens, temperature=0.0,
            extra_headers={"X-Trajectory-Id": tid},
        )  # fmt: skip
        turns += 1
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(call.function.arguments)})
    record = await client.get(f"/trajectories/{tid}", cast_to=object, options={"params": {"pop": "true"}})
    mask, ids, logprobs = record["response_mask"], record["response_ids"], record["response_logprobs"]
    return {"turns": turns, "sampled": sum(mask), "consistent": len(mask) == len(ids) == len(logprobs or [])}


async def run(args: argparse.Namespace, questions: list[str], tool: dict[str, Any]) -> list[dict[str, Any] | str]:
    """All trajectories, at most `--concurrency` at once; a failed one gives its error text."""
    client = AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=3600)
    limit = asyncio.Semaphore(args.concurrency)

    async def one(question: str) -> dict[str, Any] | str:
        async with limit:
            try:
                return await trajectory(client, args, question, tool)
            except Exception as exc:  # one failed trajectory is reported, the others still run
                return f"{type(exc).__name__}: {exc}"[:300]

    try:
        return await asyncio.gather(*(one(q) for q in questions))
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--base-url", "--model", "--data", "--system-prompt", "--tool-schema"):
        parser.add_argument(name, required=True)
    for name in ("--tasks", "--concurrency", "--max-turns", "--max-tokens"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args()
    with open(args.data, encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f if line.strip()][: args.tasks]
    tool = {"type": "function", "function": json.loads(args.tool_schema)}
    t0 = time.perf_counter()
    results = asyncio.run(run(args, questions, tool))
    wall = time.perf_counter() - t0
    done = [r for r in results if isinstance(r, dict)]
    print(json.dumps({
        "tasks": len(questions), "completed": len(done), "errors": sorted({r for r in results if isinstance(r, str)}),
        "turns": sum(r["turns"] for r in done), "turn_counts": sorted(r["turns"] for r in done),
        "generated_tokens": sum(r["sampled"] for r in done), "consistent": all(r["consistent"] for r in done),
        "wall_s": wall,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
