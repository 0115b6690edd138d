"""An agent written only against the official `openai` client, made trainable by server-side capture.

The agent runs its own tool loop (a calculator) over `/v1/chat/completions` of the wrapper's local server. Each
trajectory tags its calls with the `X-Trajectory-Id` header; afterwards the wrapper assembles the exact token
sequence (sampled ids with mask 1, tool results and template glue with mask 0) without any change to the agent.

SmolLM2-135M never writes tool calls on its own, so by default the first turn is constrained to a calculator call
with vLLM structured outputs (`--no-force` turns that off); the ids are still sampled by the engine.

    .venv/bin/python examples/openai_agent/gsm8k_openai_agent.py --limit 4
"""

from __future__ import annotations

import argparse
import json
import logging
import uuid

import anyio
import openai
from transformers import AutoTokenizer

from agentic_rl import ToolAgentEngineWrapper, ToolError, gsm8k_reward, resolve_model
from agentic_rl.tools.calculator import evaluate_expression

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
FIRST_CALL = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "[0-9]{1,4} [+*/-] [0-9]{1,4}"\}\}\n</tool_call>'


async def solve(client: openai.AsyncOpenAI, model: str, question: str, force: bool, max_turns: int = 4) -> tuple[str, list]:
    """The agent: plain OpenAI chat calls with its own tool loop. Returns its trajectory id and raw responses."""
    tid = f"gsm8k-{uuid.uuid4().hex[:12]}"
    messages: list = [{"role": "system", "content": "Solve the math problem. Use the calculator for arithmetic."},
                      {"role": "user", "content": question}]
    responses = []
    for turn in range(max_turns):
        extra = {"structured_outputs": {"regex": FIRST_CALL}} if force and turn == 0 else {}
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], max_tokens=256, temperature=0.7,
            extra_headers={"X-Trajectory-Id": tid}, extra_body=extra,
        )
        responses.append(response)
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
    parser.add_argument("--no-force", action="store_true", help="do not constrain the first turn to a tool call")
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
            results[i] = await solve(client, wrapper.agent_name, rows[i]["question"], not args.no_force)

        async with anyio.create_task_group() as tg:
            for i in range(len(rows)):
                tg.start_soon(one, i)
        return results

    try:
        results = anyio.run(run)
        for row, (tid, responses) in zip(rows, results, strict=False):
            trajectory = wrapper.captured_trajectory(tid)
            sampled = [t for t, m in zip(trajectory.response_tokens.tolist(), trajectory.response_masks.tolist(), strict=False) if m]
            engine_ids = [i for r in responses for i in r.choices[0].model_extra["token_ids"]]
            reward = gsm8k_reward({"ground_truth": row["answer"]}, trajectory.chat_completions)
            print(f"{tid}: turns={len(responses)} tool_calls={sum(bool(r.choices[0].message.tool_calls) for r in responses)} "
                  f"sampled={len(sampled)} inserted={len(trajectory.response_tokens) - len(sampled)} "
                  f"exact={sampled == engine_ids} continuous={trajectory.metrics['continuous']} reward={reward}")
    finally:
        anyio.run(wrapper.close)


if __name__ == "__main__":
    main()
