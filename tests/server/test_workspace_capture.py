"""A coding agent that speaks only the OpenAI API, working in its own workspace: the server captures its calls
token-exactly, `WorkspaceEnvironment.call_tool` runs the tool calls it receives, and the task's tests are its reward.

The real engine (SmolLM2-135M) behind the real HTTP server; its first two turns are constrained to fixed calls (an
edit, then a command), which it would not write by itself; the ids are still the ones the engine sampled.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from typing import Any

import httpx
import pytest
from support.exact import assert_captured_exactly
from support.server import MODEL_NAME

from agentic_rl.environments import WorkspaceEnvironment
from agentic_rl.rewards.workspace import workspace_tests_reward

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

FIX = {"path": "calc.py", "old_str": "return a - b", "new_str": "return a + b"}
CHECK = {"command": "python -c 'import calc; print(calc.add(2, 3))'"}


def _exactly(name: str, arguments: dict[str, Any]) -> dict[str, str]:
    """A structured-outputs regex under which the model writes exactly this Hermes call."""
    text = "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
    return {"regex": re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text).replace("\n", r"\n")}


async def _chat(client: httpx.AsyncClient, tid: str, messages: list, tools: list, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "messages": messages, "tools": tools, "max_tokens": 48, **extra}
    reply = await client.post("/chat/completions", json=body, headers={"X-Trajectory-Id": tid}, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_an_openai_agent_edits_its_workspace_runs_a_command_and_its_tests_are_the_reward(
    base_url, tokenizer, tmp_path
):
    codebase = tmp_path / "calc"
    codebase.mkdir()
    (codebase / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    for path in (tmp_path, codebase):
        path.chmod(0o755)
    (codebase / "calc.py").chmod(0o644)
    root = tmp_path / "workspaces"
    env = WorkspaceEnvironment(workspace={"root": str(root)}, tools_in_system_prompt=False)
    tid = f"ws-{uuid.uuid4().hex}"
    task = {"question": "Fix add in calc.py.", "workspace": str(codebase), "trajectory_id": tid,
            "test_command": "python -c 'import calc; assert calc.add(2, 3) == 5'"}  # fmt: skip
    sample = await env.reset(task)
    try:
        messages = list(sample.messages)
        replies, contents = [], []
        async with httpx.AsyncClient(base_url=f"{base_url}/v1") as client:
            for constraint in (_exactly("str_replace", FIX), _exactly("bash", CHECK), None):
                # The last turn is free text: whatever the model writes, no call of it can change the workspace.
                extra = {"structured_outputs": constraint, "max_tokens": 160} if constraint else {"tool_choice": "none"}
                reply = await _chat(client, tid, messages, sample.tools, **extra)
                replies.append(reply)
                message = reply["choices"][0]["message"]
                messages.append(message)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:  # the agent's own tool loop, as any OpenAI client runs it
                    result = await env.call_tool(sample, call["function"]["name"], call["function"]["arguments"])
                    contents.append(result.content)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.content})
            record = (await client.get(f"/trajectories/{tid}")).json()
        # The edit landed in this trajectory's workspace, and the command saw it.
        assert contents[0].startswith("Edited calc.py"), contents[0]
        assert contents[1].splitlines()[0] == "5" and contents[1].endswith("[exit code: 0]"), contents[1]
        reward = workspace_tests_reward(sample.task, messages)
        assert reward == 1.0 and reward.metrics["tests_exit_status"] == 0
        # Every call the agent made is one exact step of the captured trajectory.
        assert_captured_exactly(record, tokenizer, calls=len(replies))
        assert [s["response_ids"] for s in record["steps"]] == [r["choices"][0]["token_ids"] for r in replies]
        assert (codebase / "calc.py").read_text().endswith("a - b\n")  # the code base itself is untouched
    finally:
        await env.close(sample)
        await env.aclose()
    assert not root.exists() or os.listdir(root) == []
