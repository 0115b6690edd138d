"""The LLM-judge reward through the local OpenAI-compatible server."""

from __future__ import annotations

import anyio
import pytest


def test_llm_judge_reward_asks_the_local_server(base_url, serving):
    from agentic_rl.errors import RewardError
    from agentic_rl.rewards import LLMJudgeReward

    judge = LLMJudgeReward(f"{base_url}/v1", model="smollm2")
    task = {"question": "What is the capital of France?", "ground_truth": "Paris"}
    score = anyio.run(judge, task, [{"role": "assistant", "content": "<answer>Paris</answer>"}])
    assert score in (0.0, 1.0)
    assert anyio.run(judge, task, [{"role": "assistant", "content": ""}]) == 0.0  # nothing to judge, no call
    broken = LLMJudgeReward(f"{base_url}/v1", model="not-served")
    with pytest.raises(RewardError, match="judge"):
        anyio.run(broken, task, [{"role": "assistant", "content": "<answer>Paris</answer>"}])
