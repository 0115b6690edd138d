"""`build_judge`, the one place a judge is assembled: over an OpenAI-compatible endpoint (a loopback fake) or in
process over an engine, whose reply it awaits on the caller's event loop; the training run's `train_reward` and the
command line both build theirs with it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anyio
import pytest
from support.engines import ScriptedEngine
from support.fake_web import OPENAI_KEY, Fault, fake_web_fixture, fake_web_server_fixture  # noqa: F401

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.chat_client import EngineChatClient
from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config
from agentic_rl.loop.rewards import train_reward
from agentic_rl.rewards import LLMJudgeReward, MetricsReward, build_judge, call_reward
from agentic_rl.rewards.judge import EndpointChatClient

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "deep_research" / "deep_research_search_judge.yaml"
TASK = {"question": "Which city is the capital of France?", "ground_truth": "Paris"}
ANSWER = [{"role": "assistant", "content": "<answer>Paris</answer>"}]


def _completion(content: str) -> dict:
    return {
        "id": "chatcmpl-judge",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42},
    }


def _judge_script(question: str, turn: int) -> str:
    """The scripted judge: "Yes." when the quoted prediction is Paris, else "No"."""
    return "Yes." if '): "Paris"\n' in question else "No"


def test_an_endpoint_judge_asks_the_endpoint_with_its_settings(fake_web):
    url = fake_web.url("openai")
    judge = build_judge(base_url=url, model="judge", api_key=OPENAI_KEY, max_retries=0, max_tokens=3, on_failure="zero")
    assert isinstance(judge, LLMJudgeReward) and isinstance(judge.chat_client, EndpointChatClient)
    fake_web.plan("openai", Fault(body=_completion("Yes")), 500)
    assert anyio.run(judge, TASK, ANSWER) == 1.0
    failed = anyio.run(judge, TASK, ANSWER)  # no retry: the 500 is a counted 0
    assert failed == 0.0 and failed.metrics == {"judge_calls": 1, "judge_failures": 1}
    sent = fake_web.requests["openai"][0]
    assert sent.body["max_tokens"] == 3 and sent.body["model"] == "judge" and sent.body["temperature"] == 0.0
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}" and fake_web.count("openai") == 2


async def test_an_in_process_judge_awaits_the_engine_on_the_callers_loop(tokenizer):
    engine = ScriptedEngine(tokenizer, _judge_script)
    judge = build_judge(engine=engine, renderer=ChatRenderer(tokenizer), timeout_s=7.0, max_tokens=5)
    client = judge.chat_client
    assert isinstance(client, EngineChatClient) and client.engine is engine and client.timeout_s == 7.0
    assert judge.max_tokens == 5 and judge.on_failure == "raise"
    loop_thread = threading.get_ident()
    seen: list[int] = []
    generate = engine.generate

    async def recording(prompt_ids, sampling):
        seen.append(threading.get_ident())
        return await generate(prompt_ids, sampling)

    engine.generate = recording
    assert await call_reward(judge, TASK, ANSWER) == 1.0
    lyon = await call_reward(judge, TASK, [{"role": "assistant", "content": "<answer>Lyon</answer>"}])
    assert lyon == 0.0 and lyon.metrics == {"judge_calls": 1, "judge_failures": 0}
    assert seen == [loop_thread, loop_thread]  # on this loop: no thread re-entering it


def test_a_judge_needs_an_endpoint_or_an_engine(tokenizer):
    with pytest.raises(ConfigError, match="base_url and model"):
        build_judge()
    with pytest.raises(ConfigError, match="engine and its renderer"):
        build_judge(engine=ScriptedEngine(tokenizer))
    with pytest.raises(ConfigError, match="on_failure"):
        build_judge(engine=ScriptedEngine(tokenizer), renderer=ChatRenderer(tokenizer), on_failure="ignore")


def test_the_training_runs_judge_is_built_from_its_judge_section(tokenizer, monkeypatch):
    monkeypatch.chdir(ROOT)
    config = load_train_config(CONFIG, ["judge.timeout_s=12", "judge.max_tokens=6"])
    engine = ScriptedEngine(tokenizer, _judge_script)
    reward = train_reward(config, engine=engine, renderer=ChatRenderer(tokenizer))
    assert isinstance(reward, MetricsReward) and list(reward.metrics) == config.reward_metrics
    assert config.reward_metrics[0] == "hotpotqa_f1"
    judge = reward.reward_fn
    assert isinstance(judge, LLMJudgeReward) and judge.on_failure == "zero" and judge.max_tokens == 6
    assert judge.chat_client.engine is engine and judge.chat_client.timeout_s == 12
    score = anyio.run(reward, TASK, ANSWER)
    assert score == 1.0 and {k: score.metrics[k] for k in ("judge_calls", "judge_failures", "hotpotqa_f1")} == {
        "judge_calls": 1, "judge_failures": 0, "hotpotqa_f1": 1.0}  # fmt: skip
    assert "found_support" not in score.metrics  # the task has no supporting_doc_ids: that metric is left out
