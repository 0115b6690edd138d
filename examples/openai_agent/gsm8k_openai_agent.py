"""An agent written only against the official `openai` client, made trainable by server-side capture.

The agent runs its own tool loop (a calculator) over `/v1/chat/completions` of the wrapper's local server. Each
trajectory tags its calls with the `X-Trajectory-Id` header; afterwards the wrapper assembles the exact token
sequence (sampled ids with mask 1, tool results and template glue with mask 0) without any change to the agent.

SmolLM2-135M never writes tool calls on its own, so by default the first turn asks for a calculator call with
`tool_choice` (the server enforces it with vLLM structured outputs; `--no-force` leaves the choice to the model);
the ids are still sampled by the engine. `--stream` streams every call (server-sent events), which the capture
records exactly like plain calls.

    .venv/bin/python examples/openai_agent/gsm8k_openai_agent.py --limit 4 [--stream]
"""

from __future__ import annotations

import argparse
import json
import logging
import uuid
from typing import Any

import anyio
import openai
from transformers import AutoTokenizer

from agentic_rl import ToolAgentEngineWrapper, ToolError, gsm8k_reward, resolve_model
from agentic_rl.tools.calculator import evaluate_expression

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "pattern": "^[0-9 +*/().-]{1,40}$"}},
                   "required": ["expression"]}}}


async def complete(client: openai.AsyncOpenAI, stream: bool, **request) -> tuple[Any, list[int]]:
    """One chat call, plain or streamed; the completion and the token ids the engine sampled (an extension field)."""
    if not stream:
        response = await client.chat.completions.create(**request)
        return response, response.choices[0].model_extra["token_ids"]
    token_ids: list[int] = []
    async with client.chat.completions.stream(**request) as events:  # the client assembles the chunks
        async for event in events:
            if event.type == "chunk" and event.chunk.choices:
                token_ids += event.chunk.choices[0].model_extra.get("token_ids", [])
        return await events.get_final_completion(), token_ids


async def solve(client: openai.AsyncOpenAI, model: str, question: str, force: bool, stream: bool,
                max_turns: int = 4) -> tuple[str, list]:
    """The agent: plain OpenAI chat calls with its own tool loop. Returns its trajectory id and its responses."""
    tid = f"gsm8k-{uuid.uuid4().hex[:12]}"
    messages: list = [{"role": "system", "content": "Solve the math problem. Use the calculator for arithmetic."},
                      {"role": "user", "content": question}]
    responses = []
    for turn in range(max_turns):
        choice = {"type": "function", "function": {"name": "calculator"}} if force and turn == 0 else "auto"
        response, token_ids = await complete(
            client, stream, model=model, messages=messages, tools=[CALCULATOR], tool_choice=choice, max_tokens=256,
            temperature=0.7, extra_headers={"X-Trajectory-Id": tid},
        )
        responses.append((response, token_ids))
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = evaluate_expression(json.loads(call.function.arguments).get("expression", ""))
            except (ToolError, json.JSONDecodeError, AttributeError) as exc:
                result = f"Error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return tid, responses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data/gsm8k_test.jsonl")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--no-force", action="store_true", help="do not ask for a tool call on the first turn")
    parser.add_argument("--stream", action="store_true", help="stream every call (server-sent events)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    model_dir = resolve_model("smollm2-135m-instruct")
    wrapper = ToolAgentEngineWrapper("gsm8k_openai", AutoTokenizer.from_pretrained(model_dir), model=model_dir,
                                     max_prompt_length=2048, max_response_length=1024,
                                     engine_options={"kv_cache_gib": 0.5})  # fmt: skip
    wrapper.initialize()  # starts the engine and its server: wrapper.server_addresses
    with open(args.data) as f:
        rows = [json.loads(line) for _, line in zip(range(args.limit), f, strict=False)]

    async def run() -> list:
        client = openai.AsyncOpenAI(base_url=f"http://{wrapper.server_addresses[0]}/v1", api_key="local")
        results: list = [None] * len(rows)

        async def one(i: int) -> None:
            results[i] = await solve(client, wrapper.agent_name, rows[i]["question"], not args.no_force, args.stream)

        async with anyio.create_task_group() as tg:
            for i in range(len(rows)):
                tg.start_soon(one, i)
        return results

    try:
        results = anyio.run(run)
        for row, (tid, responses) in zip(rows, results, strict=False):
            trajectory = wrapper.captured_trajectory(tid)
            sampled = [t for t, m in zip(trajectory.response_tokens.tolist(), trajectory.response_masks.tolist(), strict=False) if m]
            engine_ids = [i for _, token_ids in responses for i in token_ids]
            reward = gsm8k_reward({"ground_truth": row["answer"]}, trajectory.chat_completions)
            calls = sum(bool(r.choices[0].message.tool_calls) for r, _ in responses)
            print(f"{tid}: turns={len(responses)} tool_calls={calls} "
                  f"sampled={len(sampled)} inserted={len(trajectory.response_tokens) - len(sampled)} "
                  f"exact={sampled == engine_ids} continuous={len(trajectory.token_runs()) == 1} reward={reward}")
    finally:
        anyio.run(wrapper.close)


if __name__ == "__main__":
    main()
