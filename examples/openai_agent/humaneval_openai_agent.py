"""A coding agent written only against the official `openai` client, working in a private workspace per problem,
made trainable by server-side capture.

Each HumanEval problem is a workspace task (`agentic_rl.coding_tasks`): `WorkspaceEnvironment.reset` gives the
trajectory its own copy of the problem's code base; the agent runs its own tool loop over `/v1/chat/completions` of
the wrapper's local server (tagged with `X-Trajectory-Id`), and hands every tool call it receives to
`WorkspaceEnvironment.call_tool` (bash, view, create, str_replace, insert in that workspace). When the agent stops,
the problem's hidden test runs in the workspace (`workspace_tests_reward`), then `close` removes the workspace; the
wrapper assembles the exact token sequence of the trajectory (`captured_trajectory`).

    .venv/bin/python examples/openai_agent/humaneval_openai_agent.py --limit 2 [--model smollm2-135m-tools]
"""

from __future__ import annotations

import argparse
import logging
import uuid
from typing import Any

import anyio
import openai
from transformers import AutoTokenizer

import agentic_rl.loop  # noqa: F401  (registers the SFT-built models, smollm2-135m-tools among them)
from agentic_rl import ToolAgentEngineWrapper, resolve_model
from agentic_rl.coding_tasks import humaneval_tasks
from agentic_rl.environments import WorkspaceEnvironment
from agentic_rl.rewards.workspace import workspace_tests_reward


async def solve(client: openai.AsyncOpenAI, model: str, env: WorkspaceEnvironment, task: dict[str, Any],
                max_turns: int) -> tuple[str, float, int, list[int]]:
    """The agent: plain OpenAI chat calls, its tool calls run in the task's workspace. Returns its trajectory id,
    its reward (the hidden test's verdict), how many tool calls it made and the token ids the engine sampled for
    it (an extension field of every reply)."""
    tid = f"humaneval-{uuid.uuid4().hex[:12]}"
    sample = await env.reset({**task, "trajectory_id": tid})
    messages: list = list(sample.messages)
    calls, sampled = 0, []
    try:
        for _ in range(max_turns):
            response = await client.chat.completions.create(
                model=model, messages=messages, tools=sample.tools, max_tokens=640, temperature=0.8,
                extra_headers={"X-Trajectory-Id": tid},
            )
            sampled += response.choices[0].model_extra["token_ids"]
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                reply = await env.call_tool(sample, call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": reply.content})
                calls += 1
        reward = await anyio.to_thread.run_sync(workspace_tests_reward, sample.task, messages)
    finally:
        await env.close(sample)  # its processes and folder are removed
    return tid, float(reward), calls, sampled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-tools")
    parser.add_argument("--start", type=int, default=144, help="first problem (144-163 are the held-out 20)")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=6)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    model_dir = resolve_model(args.model)
    wrapper = ToolAgentEngineWrapper("humaneval_openai", AutoTokenizer.from_pretrained(model_dir), model=model_dir,
                                     max_prompt_length=2048, max_response_length=4096,
                                     engine_options={"kv_cache_gib": 0.5})  # fmt: skip
    wrapper.initialize()  # starts the engine and its server: wrapper.server_addresses
    tasks = humaneval_tasks()[args.start : args.start + args.limit]
    env = WorkspaceEnvironment(tools_in_system_prompt=False)  # the server renders the tools the request names

    async def run() -> list:
        client = openai.AsyncOpenAI(base_url=f"http://{wrapper.server_addresses[0]}/v1", api_key="local")
        results: list = [None] * len(tasks)

        async def one(i: int) -> None:
            results[i] = await solve(client, wrapper.agent_name, env, tasks[i], args.max_turns)

        try:
            async with anyio.create_task_group() as tg:
                for i in range(len(tasks)):
                    tg.start_soon(one, i)
        finally:
            await env.aclose()
        return results

    try:
        for task, (tid, reward, calls, engine_ids) in zip(tasks, anyio.run(run), strict=True):
            trajectory = wrapper.captured_trajectory(tid)
            ids, mask = trajectory.response_tokens.tolist(), trajectory.response_masks.tolist()
            sampled = [i for i, m in zip(ids, mask, strict=True) if m]
            print(f"{task['id']}: steps={len(trajectory.steps)} tool_calls={calls} sampled={len(sampled)} "
                  f"exact={sampled == engine_ids} runs={len(trajectory.token_runs())} passed={reward == 1.0}")
    finally:
        anyio.run(wrapper.close)


if __name__ == "__main__":
    main()
