"""The benchmarks' simulated batching engine (`benchmarks/sim_engine.py`): it drives our rollout and our server
through forced tool-call turns with exact token records, and its step clock is shared by the requests in flight."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine
from agentic_rl.engine.sampling import SamplingConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def sim(monkeypatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("sim_engine")


@pytest.fixture
def renderer(tokenizer) -> ChatRenderer:
    return ChatRenderer(tokenizer)


def test_rollout_runs_every_trajectory_to_max_turns_with_exact_token_records(sim, tokenizer, renderer):
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper
    from agentic_rl.tools.registry import build_tools

    turn = sim.tool_call_turn(renderer)
    engine = sim.BatchingEngine(turn, renderer.end_of_turn_id, step_s=1e-5, logprob=-0.25)
    assert isinstance(engine, Engine)
    turns, n = 8, 16
    wrapper = ToolAgentEngineWrapper("sim", tokenizer, {"temperature": 0.0, "max_tokens": 64}, max_prompt_length=2048,
                                     max_response_length=4096, n_parallel_agents=n, max_steps=turns, engine=engine,
                                     tools=build_tools(["calculator"]), serve=False)  # fmt: skip
    wrapper.initialize()
    tasks = [{"id": i, "question": f"What is {i} times 7?", "ground_truth": str(7 * i)} for i in range(n)]

    async def go() -> list[Any]:
        try:
            return await wrapper.generate_agent_trajectories_async(tasks)
        finally:
            await wrapper.close()

    trajectories = anyio.run(go)
    sampled_turn = [*turn, renderer.end_of_turn_id]
    for t in trajectories:
        assert not t.failed, t.error
        assert t.metrics["steps"] == turns and t.termination_reason == "max_steps"
        assert t.metrics["tool_calls"] == turns  # every turn was read as one calculator call
        ids, mask, logprobs = t.response_tokens.tolist(), t.response_masks.tolist(), t.response_logprobs.tolist()
        assert len(ids) == len(mask) == len(logprobs)
        assert [i for i, m in zip(ids, mask, strict=True) if m] == sampled_turn * turns
        assert {lp for lp, m in zip(logprobs, mask, strict=True) if m} == {-0.25}
        assert {lp for lp, m in zip(logprobs, mask, strict=True) if not m} == {0.0}
        assert t.num_generated_tokens == turns * len(sampled_turn)
        roles = [m["role"] for m in t.chat_completions]
        assert roles.count("assistant") == turns
        answer = t.chat_completions[roles.index("assistant") + 1]  # the observation after the first turn
        assert answer["role"] != "assistant" and "42" in answer["content"]  # the calculator's answer to 6*7
    assert engine.requests == n * turns and engine.tokens_sampled == n * turns * len(sampled_turn)


def test_our_server_answers_with_the_forced_tool_call(sim, tokenizer, renderer):
    from agentic_rl.server.app import create_app
    from agentic_rl.server.serving import OpenAIServing
    from agentic_rl.server.thread import ServerThread

    engine = sim.BatchingEngine(sim.tool_call_turn(renderer, arguments={"expression": "2+3"}), renderer.end_of_turn_id)
    thread = ServerThread(create_app(OpenAIServing(engine, tokenizer, model_name="sim")))
    thread.start()
    tool = {"type": "function", "function": {"name": "calculator", "description": "Arithmetic.",
                                             "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}  # fmt: skip
    try:
        response = httpx.post(f"http://{thread.address}/v1/chat/completions", timeout=30, json={
            "model": "sim", "messages": [{"role": "user", "content": "2+3?"}], "tools": [tool], "max_tokens": 64,
            "logprobs": True,
        })  # fmt: skip
    finally:
        thread.stop()
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2+3"}
    assert choice["token_ids"] == [*engine.tokens, engine.eot]
    assert [x["logprob"] for x in choice["logprobs"]["content"]] == [-0.5] * len(choice["token_ids"])


def test_requests_in_flight_share_the_decode_steps(sim):
    engine = sim.BatchingEngine([5, 6, 7], 9, step_s=0.5)
    origin = engine._origin
    a = engine.admit(4, origin + 0.1)  # joins at step 1, runs steps 1-4
    b = engine.admit(4, origin + 0.2)  # same steps: the batch shares them
    c = engine.admit(2, origin + 1.6)  # joins at step 4, runs steps 4-5: one step more than the union so far
    assert (a, b, c) == (origin + 2.5, origin + 2.5, origin + 3.0)
    assert engine.busy_s == pytest.approx(2.5) and engine.requests == 3 and engine.tokens_sampled == 10
    engine.admit(1, origin + 10.2)  # after an idle gap: one more busy step
    assert engine.busy_s == pytest.approx(3.0)
    engine.reset_stats()
    assert (engine.busy_s, engine.requests, engine.tokens_sampled) == (0.0, 0, 0)


def test_a_turn_longer_than_max_tokens_is_cut_and_bad_settings_are_refused(sim):
    engine = sim.BatchingEngine([5, 6, 7], 9, step_s=1e-6)
    whole = engine.turn(SamplingConfig(max_tokens=4, logprobs=1))
    assert (whole.token_ids, whole.finish_reason, whole.stop_reason) == ([5, 6, 7, 9], "stop", 9)
    assert whole.top_logprobs == [{5: -0.5}, {6: -0.5}, {7: -0.5}, {9: -0.5}]
    cut = anyio.run(engine.generate, [1, 2], SamplingConfig(max_tokens=2))
    assert (cut.token_ids, cut.logprobs, cut.finish_reason, cut.stop_reason) == ([5, 6], [-0.5, -0.5], "length", None)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="step_s"):
            sim.BatchingEngine([5], 9, step_s=bad)
    with pytest.raises(ValueError, match="logprob"):
        sim.BatchingEngine([5], 9, logprob=0.5)
    with pytest.raises(ValueError, match="tokens"):
        sim.BatchingEngine([], 9)
