"""`EngineChatClient`: memory summaries and LLM-judge verdicts from the in-process engine, with no HTTP server."""

from __future__ import annotations

import functools

import anyio
import pytest
from support.engines import RecordingEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Generation
from agentic_rl.engine.chat_client import ChatClient, EngineChatClient
from agentic_rl.errors import ConfigError, EngineAbortedError, EngineError, RewardError
from agentic_rl.memory import ChatSummaryClient, MemorySummary, SummaryClient, summary_request
from agentic_rl.rewards import LLMJudgeReward, call_reward, judge_verdict

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
TASK = {"question": "What is the capital of France?", "ground_truth": "Paris"}
ANSWER = [{"role": "assistant", "content": "<answer>Paris</answer>"}]
SUMMARY_CONFIG = {"use_summary": True, "max_prompt_length": 400, "max_summary_length": 48, "before_raw_message": 2,
                  "end_raw_message": -2}  # fmt: skip


def _history(n_pairs: int = 16) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": "Find the population of three cities and add them up."}]  # fmt: skip
    for i in range(n_pairs):
        messages.append({"role": "assistant", "content": f"Looking up city number {i} now."})
        messages.append({"role": "tool", "content": f"City {i} has {1000 + 37 * i} inhabitants."})
    return messages


class _StubEngine:
    """An engine that answers every request with `generation` (or raises it), recording the requests."""

    max_model_len = 2048
    weight_version = 0

    def __init__(self, generation: Generation | Exception, *, max_model_len: int = 2048) -> None:
        self.generation, self.max_model_len, self.calls = generation, max_model_len, []

    async def generate(self, prompt_ids, sampling):
        self.calls.append((list(prompt_ids), sampling))
        if isinstance(self.generation, Exception):
            raise self.generation
        return self.generation


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


# ---- the client alone (no engine) -----------------------------------------------------------------------------


def test_request_renders_the_messages_and_stops_on_the_end_of_turn_token(renderer):
    stub = _StubEngine(Generation([], [], "stop"), max_model_len=60)
    client = EngineChatClient(stub, renderer, sampling={"temperature": 0.5, "stop_token_ids": [7]})
    prompt_ids, sampling = client.request(QUESTION, max_tokens=1000)
    assert prompt_ids == renderer.prompt_ids(QUESTION)
    assert sampling.stop_token_ids == [renderer.end_of_turn_id, 7]
    assert sampling.max_tokens == 60 - len(prompt_ids)  # lowered to what is left of the window
    assert sampling.temperature == 0.5 and client.sampling.max_tokens is None  # the client's own options untouched
    assert EngineChatClient(stub, renderer).sampling.temperature == 0.0  # greedy by default
    assert isinstance(client, ChatClient) and not isinstance(client, SummaryClient)
    with pytest.raises(ConfigError, match="temperature"):
        EngineChatClient(stub, renderer, sampling={"temperature": -1})
    with pytest.raises(EngineError, match="no room"):
        EngineChatClient(_StubEngine(Generation([], [], "stop"), max_model_len=len(prompt_ids)), renderer).request(
            QUESTION, max_tokens=4
        )


def test_reply_text_leaves_out_the_stop_token_and_an_aborted_request_raises(renderer, tokenizer):
    ids = [*tokenizer.encode("Paris.", add_special_tokens=False), renderer.end_of_turn_id]
    stub = _StubEngine(Generation(ids, [0.0] * len(ids), "stop"))
    assert anyio.run(functools.partial(EngineChatClient(stub, renderer).chat, QUESTION, max_tokens=8)) == "Paris."
    aborted = EngineChatClient(_StubEngine(Generation(ids[:1], [0.0], "abort")), renderer)
    with pytest.raises(EngineAbortedError, match="abort"):
        anyio.run(functools.partial(aborted.chat, QUESTION, max_tokens=8))


def test_failing_engine_is_a_summary_fallback_and_a_judge_reward_error(renderer, tokenizer):
    broken = EngineChatClient(_StubEngine(EngineError("engine is closed")), renderer)
    memory = MemorySummary(SUMMARY_CONFIG, chat_client=broken, tokenizer=tokenizer, messages=_history())
    out = memory.get_prompt_messages()
    assert memory.fallbacks == 1 and memory.summaries == 0 and memory.count_tokens(out) <= 400
    judge = LLMJudgeReward(client=broken)
    with pytest.raises(RewardError, match="judge call failed: EngineError: engine is closed"):
        anyio.run(judge, TASK, ANSWER)

    async def as_the_harness_calls_it() -> None:
        with pytest.raises(RewardError, match="engine is closed"):
            await call_reward(judge, TASK, ANSWER)

    anyio.run(as_the_harness_calls_it)
    counted = anyio.run(
        LLMJudgeReward(client=broken, on_failure="zero"), TASK, ANSWER
    )  # as training judges: 0, counted
    assert counted == 0.0 and counted.metrics == {"judge_calls": 1, "judge_failures": 1}
    with pytest.raises(ConfigError, match="base_url"):
        LLMJudgeReward()


# ---- on the real engine -----------------------------------------------------------------------------------------


def test_engine_client_answers_as_the_server_does(engine, renderer, serving):
    client = EngineChatClient(engine, renderer)
    text = anyio.run(functools.partial(client.chat, QUESTION, max_tokens=16))
    served = anyio.run(serving.chat_completion, {"model": "smollm2", "messages": QUESTION, "max_tokens": 16,
                                                 "temperature": 0.0})  # fmt: skip
    assert text and text == served["choices"][0]["message"]["content"]


def test_summaries_come_from_the_engine(engine, renderer, tokenizer):
    recording = RecordingEngine(engine)
    messages = _history()
    memory = MemorySummary(SUMMARY_CONFIG, chat_client=EngineChatClient(recording, renderer), tokenizer=tokenizer,
                           messages=messages)  # fmt: skip
    assert isinstance(memory.chat_client, ChatSummaryClient)
    out = anyio.run(memory.aget_prompt_messages)
    assert memory.summaries == 1 and memory.fallbacks == 0
    assert [m["role"] for m in out] == ["system", "user", "summary", "assistant", "tool"]
    ((prompt_ids, sampling, generation),) = recording.calls
    system_prompt = memory.config.summary_system_prompt.format(max_summary_length=48)
    assert prompt_ids == renderer.prompt_ids(summary_request(messages[2:-2], system_prompt))
    assert sampling.max_tokens == 48 and sampling.temperature == 0.0
    reply = renderer.decode(generation.token_ids)
    assert out[2]["content"] and out[2]["content"] in reply


def test_judge_verdicts_come_from_the_engine(engine, renderer):
    recording = RecordingEngine(engine)
    judge = LLMJudgeReward(client=EngineChatClient(recording, renderer))
    direct = anyio.run(judge, TASK, ANSWER)  # from synchronous code: its own event loop

    async def as_the_harness_calls_it() -> float:
        return await call_reward(judge, TASK, ANSWER)  # awaited on the loop that serves the engine

    threaded = anyio.run(as_the_harness_calls_it)
    assert len(recording.calls) == 2 and direct == threaded
    for prompt_ids, sampling, generation in recording.calls:
        assert "Reference answer: Paris" in renderer.decode(prompt_ids) and sampling.max_tokens == 4
        assert direct == (judge_verdict(renderer.decode(generation.token_ids)) or 0.0)
    assert (
        anyio.run(judge, TASK, [{"role": "assistant", "content": ""}]) == 0.0 and len(recording.calls) == 2
    )  # no call


def test_wrapper_summarizes_and_judges_with_its_engine_and_starts_no_server(engine, tokenizer):
    from agentic_rl import ToolAgentEngineWrapper

    recording = RecordingEngine(engine)
    wrapper = ToolAgentEngineWrapper("agent", tokenizer, {"max_tokens": 24, "temperature": 0.0}, 1024, 512, 1, 1,
                                     engine=recording, serve=False, memory=SUMMARY_CONFIG)  # fmt: skip
    wrapper.initialize()
    try:
        assert wrapper.server_addresses == []
        memory = wrapper.memory_factory()
        assert memory.chat_client.chat_client.engine is recording
        for message in _history():
            memory.add_message(message)
        anyio.run(memory.aget_prompt_messages)
        assert memory.summaries == 1 and len(recording.calls) == 1
        assert memory.messages[2]["content"] in _reply_text(wrapper, recording.calls[0][2])

        wrapper.reward_fn = LLMJudgeReward(client=EngineChatClient(wrapper.engine, wrapper.renderer))
        (traj,) = anyio.run(wrapper.generate_agent_trajectories_async, [{"id": 1, **TASK}])
        assert not traj.failed, traj.error
        assert len(recording.calls) == 3  # the summary, the one turn, the judge
        reply = _reply_text(wrapper, recording.calls[2][2])
        assert traj.metrics["res_reward"] == (judge_verdict(reply) or 0.0)
        assert traj.metrics["judge_calls"] == 1 and traj.metrics["judge_failures"] == (judge_verdict(reply) is None)
        assert wrapper.server_addresses == []
    finally:
        anyio.run(wrapper.close)


def _reply_text(wrapper, generation: Generation) -> str:
    return wrapper.renderer.decode(generation.token_ids)
