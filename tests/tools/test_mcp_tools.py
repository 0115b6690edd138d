"""MCP servers as tools (agentic_rl.tools.mcp), against real servers written with the `mcp` package's server API
(tests/support/mcp_server.py): over stdio (run with sys.executable) and streamable HTTP on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.tools.mcp import MCPTool, MCPToolsEntry, build_mcp_tools
from agentic_rl.tools.registry import build_tools

SERVER = str(Path(__file__).parents[1] / "support" / "mcp_server.py")
STDIO = [sys.executable, SERVER, "stdio"]


def _stdio(**extra):
    return {"mcp": {"command": STDIO, **extra}}


def _close(tools):
    tools[0].connection.close()


async def _turn(env, sample, calls):
    """One assistant turn of Hermes tool calls; the step's tool observations and info."""
    text = "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for n, a in calls)
    sample.messages.append({"role": "assistant", "content": text})
    result = await env.step(sample)
    sample.messages.extend(result.observation)
    return [m["content"] for m in result.observation], result.info


def test_discovery_offers_the_servers_schemas_and_a_subset():
    tools = build_mcp_tools(_stdio())
    try:
        assert [t.name for t in tools] == ["add", "echo", "count", "crash", "hang", "picture", "fail"]
        add = tools[0].schema["function"]
        assert add["description"] == "Add two integers."
        assert add["parameters"]["properties"] == {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}}
        assert add["parameters"]["required"] == ["a", "b"]
    finally:
        _close(tools)
    subset = build_tools(["calculator", _stdio(tools=["echo", "add"])])
    try:
        assert [t.name for t in subset] == ["calculator", "echo", "add"]
        env = ToolEnvironment(subset)
        assert [s["function"]["name"] for s in env.schemas] == ["calculator", "echo", "add"]
    finally:
        _close(subset[1:])


def test_a_call_becomes_an_observation_and_failures_are_counted_errors():
    tools = build_mcp_tools(_stdio(timeout_s=2))
    env = ToolEnvironment(tools)

    async def main():
        sample = await env.reset({"question": "q", "id": "t0"})
        texts, info = await _turn(env, sample, [("add", {"a": 2, "b": 40}), ("picture", {}), ("fail", {})])
        assert texts[:2] == ["42", "[image content: image/png]"]
        assert texts[2].startswith("Error: tool 'fail' failed")
        assert info["tool_calls"] == 3 and info["tool_errors"] == 1
        started = time.monotonic()
        texts, info = await _turn(env, sample, [("hang", {})])
        assert texts == ["Error: tool 'hang' timed out after 2 s"] and info["tool_errors"] == 1
        assert time.monotonic() - started < 15
        texts, info = await _turn(env, sample, [("crash", {})])
        assert texts[0].startswith("Error: tool 'crash' failed: the MCP server died"), texts
        assert info["tool_errors"] == 1
        texts, info = await _turn(env, sample, [("count", {})])  # a fresh server after the crash
        assert texts[0].startswith("1 pid=") and info["tool_errors"] == 0
        await env.close(sample)
        await env.aclose()

    anyio.run(main)
    assert tools[0].connection.errors == {"tool_error": 1, "timeout": 1, "server_died": 1}


def test_each_trajectory_has_its_own_session_under_concurrency():
    tools = build_mcp_tools(_stdio(tools=["count"]))
    env = ToolEnvironment(tools)
    seen = {}

    async def trajectory(i):
        sample = await env.reset({"question": "q", "id": f"t{i}"})
        values = []
        for _ in range(3):
            texts, _ = await _turn(env, sample, [("count", {})])
            values.append(texts[0])
        await env.close(sample)
        seen[i] = values

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(trajectory, i)
        await env.aclose()

    anyio.run(main)
    for values in seen.values():
        assert [v.split()[0] for v in values] == ["1", "2", "3"], values
        assert len({v.split()[1] for v in values}) == 1  # one server process per trajectory
    assert len({values[0].split()[1] for values in seen.values()}) == 8
    assert len(seen) == 8


def test_a_server_that_does_not_start_names_its_command_and_stderr():
    command = [sys.executable, "-c", "import sys; sys.stderr.write('cannot open the database'); sys.exit(3)"]
    with pytest.raises(ConfigError) as caught:
        build_mcp_tools({"mcp": {"command": command, "start_timeout_s": 20}})
    assert "cannot open the database" in str(caught.value) and "sys.exit(3)" in str(caught.value)
    with pytest.raises(ConfigError, match="no tool"):
        build_mcp_tools(_stdio(tools=["add", "nope"]))


def test_entries_are_validated_in_a_training_config():
    config = TrainConfig.model_validate({"tools": ["calculator", {"mcp": {"url": "http://127.0.0.1:1/mcp"}}]})
    assert isinstance(config.tools[1], MCPToolsEntry) and config.tools[1].mcp.session == "per_trajectory"
    for bad in [{"mcp": {}}, {"mcp": {"command": ["x"], "url": "http://h/mcp"}}, {"mcp": {"url": "ftp://h"}}]:
        with pytest.raises(ConfigError):
            build_mcp_tools(bad)
    assert MCPToolsEntry.model_validate({"mcp": {"command": "python s.py stdio"}}).mcp.command == ["python", "s.py", "stdio"]


@pytest.fixture
def http_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port), "--stateless"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:  # readiness: the port accepts a connection
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the HTTP MCP server did not listen within 60 s"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp", proc
    proc.kill()
    proc.wait()


def test_streamable_http_shared_session(http_server):
    tools = build_mcp_tools({"mcp": {"url": http_server[0], "tools": ["add", "hang"], "session": "shared", "timeout_s": 2}})
    assert all(isinstance(t, MCPTool) for t in tools)
    add, hang = tools

    async def main():
        results = []

        async def one(i):
            results.append(await add.execute_session(f"t{i}", {"a": i, "b": 1}))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        assert sorted(results, key=int) == [str(i + 1) for i in range(8)]
        with pytest.raises(ToolError, match="timed out after 2 s"):
            await hang.execute_session("t0", {})
        assert await add.execute_session("t0", {"a": 1, "b": 1}) == "2"
        await add.session_end("t0")
        await add.aclose()
        with pytest.raises(ToolError, match="closed"):  # never a hang on a closed client
            await add.execute_session("t1", {"a": 1, "b": 1})

    anyio.run(main)


def test_the_command_line_and_a_training_config_check_servers_before_the_engine():
    from agentic_rl.loop.sources import load_classes
    from agentic_rl.tools.mcp import check_mcp_server, parse_mcp_option

    assert parse_mcp_option("http://127.0.0.1:9/mcp").mcp.url == "http://127.0.0.1:9/mcp"
    assert parse_mcp_option(f"{sys.executable} {SERVER} stdio").mcp.command == STDIO
    entry = parse_mcp_option(json.dumps({"command": STDIO, "tools": ["add"], "session": "shared"}))
    assert entry.mcp.tools == ["add"] and entry.mcp.session == "shared"
    with pytest.raises(ConfigError, match="--mcp"):
        parse_mcp_option('{"command": ["x"], "color": "red"}')
    assert check_mcp_server(entry) == ["add"]
    broken = MCPToolsEntry.model_validate({"mcp": {"command": [sys.executable, "-c", "raise SystemExit('no license')"]}})
    with pytest.raises(ConfigError, match="no license"):
        load_classes(tools=["calculator", broken], environment=None, agent=None)


def test_a_rollout_offers_the_servers_tools_and_keeps_each_trajectorys_state(tokenizer):
    """The rollout's own machinery (tool agent, harness, Rollout) over a scripted engine with the real tokenizer and
    chat template: the schema reaches the prompt, each trajectory calls `count` twice in its own session."""
    from support.engines import ScriptedEngine

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.rollout.agent import close_tool_agent, tool_agent_spec
    from agentic_rl.rollout.harness import HarnessConfig
    from agentic_rl.rollout.session import Rollout

    def script(question, turn):
        return '<tool_call>\n{"name": "count", "arguments": {}}\n</tool_call>' if turn < 2 else "The answer is 2."

    renderer = ChatRenderer(tokenizer)
    tools = build_tools([_stdio(tools=["count"])])
    config = HarnessConfig(max_steps=4, max_prompt_length=2048, max_response_length=1024)
    spec = tool_agent_spec(renderer, ScriptedEngine(tokenizer, script), tools=tools, config=config)
    tasks = [{"id": f"t{i}", "question": f"Count twice ({i}).", "ground_truth": "2"} for i in range(4)]

    async def main():
        try:
            return (await Rollout(spec, n_parallel_agents=4).run(tasks)).trajectories
        finally:
            await close_tool_agent(spec)

    trajectories = anyio.run(main)
    pids = set()
    for traj in trajectories:
        assert not traj.failed, traj.error
        observed = [m["content"] for m in traj.chat_completions if m["role"] == "tool"]
        assert [o.split()[0] for o in observed] == ["1", "2"], observed
        assert observed[0].split()[1] == observed[1].split()[1]
        pids.add(observed[0].split()[1])
        assert '"name": "count"' in renderer.decode(traj.steps[0].prompt_ids)
    assert len(pids) == 4


def test_an_http_server_that_dies_or_is_not_there_is_an_error_never_a_hang(http_server):
    url, proc = http_server
    (echo,) = build_mcp_tools({"mcp": {"url": url, "tools": ["echo"], "timeout_s": 5, "start_timeout_s": 5}})

    async def main():
        assert await echo.execute_session("t0", {"text": "hi"}) == "hi"
        proc.kill()
        proc.wait()
        started = time.monotonic()
        with pytest.raises(ToolError):
            await echo.execute_session("t0", {"text": "again"})
        assert time.monotonic() - started < 15
        await echo.session_end("t0")
        await echo.aclose()

    anyio.run(main)
    assert sum(echo.connection.errors.values()) == 1
    with pytest.raises(ConfigError, match=url.replace("/", ".")):
        build_mcp_tools({"mcp": {"url": url, "start_timeout_s": 5}})
