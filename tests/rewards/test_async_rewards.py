"""Async rewards: `call_reward` awaits an `async def` reward on the caller's loop and runs a sync one in a worker
thread; through the real harness path (`run_trajectory` over a scripted engine) an async reward scores, its metrics
join the trajectory's, and past `reward_timeout_s` it is cancelled and its trajectory fails."""

from __future__ import annotations

import functools
import threading
from typing import Any

import anyio
import pytest
from support.engines import CountingEnvironment, ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.errors import RewardError
from agentic_rl.rewards import MetricsReward, RewardWithMetrics, call_reward, hotpotqa_f1_reward, is_async_reward
from agentic_rl.rewards.base import score_answer
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

TASK = {"question": "Capital of France?", "ground_truth": "Paris"}
ANSWER = [{"role": "assistant", "content": "<answer>Paris</answer>"}]


async def async_reward(task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
    await anyio.sleep(0)
    return 1.0 if "Paris" in messages[-1]["content"] else 0.0


class AsyncCallable:
    async def __call__(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        return 0.5


def sync_reward(task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
    return 0.25


def test_which_rewards_are_async():
    assert is_async_reward(async_reward) and is_async_reward(AsyncCallable())
    assert is_async_reward(functools.partial(async_reward, TASK))
    assert not is_async_reward(sync_reward) and not is_async_reward(hotpotqa_f1_reward)
    assert not is_async_reward(MetricsReward.__init__) and is_async_reward(MetricsReward(sync_reward, {}))


async def test_call_reward_awaits_async_rewards_on_the_loop_and_runs_sync_ones_in_a_thread():
    loop_thread = threading.get_ident()
    seen: dict[str, int] = {}

    async def where_async(task, messages):
        seen["async"] = threading.get_ident()
        return 1.0

    def where_sync(task, messages):
        seen["sync"] = threading.get_ident()
        return 2.0

    def returns_awaitable(task, messages):
        return async_reward(task, messages)  # a coroutine: awaited too

    assert await call_reward(where_async, TASK, ANSWER) == 1.0
    assert await call_reward(where_sync, TASK, ANSWER) == 2.0
    assert await call_reward(AsyncCallable(), TASK, ANSWER) == 0.5
    assert await call_reward(returns_awaitable, TASK, ANSWER) == 1.0
    assert seen["async"] == loop_thread and seen["sync"] != loop_thread


async def test_score_answer_bounds_an_async_reward_by_cancelling_it():
    cancelled = anyio.Event()

    async def never(task, messages):
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    metrics: dict[str, Any] = {}
    with pytest.raises(RewardError, match="did not finish within reward_timeout_s=0.1"):
        await score_answer(never, TASK, ANSWER, timeout_s=0.1, metrics=metrics)
    assert cancelled.is_set()  # the coroutine was cancelled, not left running
    assert metrics["reward_error"].startswith("RewardError: ") and metrics["reward_time"] >= 0.0

    async def nan(task, messages):
        return RewardWithMetrics(float("nan"), {"judge_calls": 1})

    with pytest.raises(RewardError, match="returned nan"):
        await score_answer(nan, TASK, ANSWER, timeout_s=5, metrics=metrics)
    assert metrics["judge_calls"] == 1  # a reward's own metrics are kept, as for a sync one


@pytest.mark.parametrize(
    ("returned", "message"),
    [("high", "returned 'high' (str), not a number"), (None, "returned None"), (True, "returned True (bool)"),
     ([1.0], "returned list, not a number"), ("0.7", "returned '0.7' (str)")],
)  # fmt: skip
async def test_score_answer_refuses_a_reward_that_is_not_a_number(returned, message):
    def reward(task, messages):
        return returned

    metrics: dict[str, Any] = {}
    with pytest.raises(RewardError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        await score_answer(reward, TASK, ANSWER, timeout_s=5, metrics=metrics)
    assert metrics["reward_error"].startswith("RewardError: reward function returned")


async def test_score_answer_takes_any_real_number():
    import numpy as np

    for returned, expected in [(1, 1.0), (np.float32(0.5), 0.5), (RewardWithMetrics(0.25, {"f1": 0.5}), 0.25)]:
        metrics: dict[str, Any] = {}
        reward = await score_answer(lambda task, messages, r=returned: r, TASK, ANSWER, timeout_s=5, metrics=metrics)
        assert reward == expected and type(reward) is float


async def test_metrics_reward_over_an_async_reward_and_sync_metrics():
    async def judged(task, messages):
        return RewardWithMetrics(1.0, {"judge_calls": 1})

    def broken(task, messages):
        raise ValueError("no")

    reward = MetricsReward(judged, {"hotpotqa_f1": hotpotqa_f1_reward, "broken": broken, "async": async_reward})
    score = await reward(TASK, ANSWER)
    assert score == 1.0 and score.metrics == {"judge_calls": 1, "hotpotqa_f1": 1.0, "async": 1.0}
    assert await MetricsReward(sync_reward, {})(TASK, ANSWER) == 0.25  # a sync reward inside, in a thread


# ---- through the harness ------------------------------------------------------------------------------------------


def _answers(question: str, turn: int) -> str:
    return question.split("answer=", 1)[1]


def _spec(tokenizer: Any, reward_fn: Any, **config: Any) -> RolloutSpec:
    harness = HarnessConfig(max_steps=2, max_prompt_length=2048, max_response_length=1024, **config)
    return RolloutSpec(
        engine=ScriptedEngine(tokenizer, _answers),
        environment=CountingEnvironment([CalculatorTool()]),
        renderer=ChatRenderer(tokenizer),
        config=harness,
        reward_fn=reward_fn,
    )


def _task(i: int, answer: str) -> dict[str, Any]:
    return {"id": i, "question": f"Capital of France? answer={answer}", "ground_truth": "Paris"}


async def test_an_async_reward_scores_through_the_harness_and_its_metrics_join(tokenizer):
    engine_loop: list[int] = []

    async def reward(task, messages):
        engine_loop.append(threading.get_ident())
        await anyio.sleep(0)
        score = 1.0 if "Paris" in messages[-1]["content"] else 0.0
        return RewardWithMetrics(score, {"asked": 1})

    spec = _spec(tokenizer, reward)
    trajectories = await run_tasks(
        [_task(0, "Paris"), _task(1, "Lyon")], lambda task, idx: run_trajectory(task, idx, spec), n_parallel_agents=2
    )
    assert [t.failed for t in trajectories] == [False, False]
    assert [t.metrics["res_reward"] for t in trajectories] == [1.0, 0.0]
    assert [t.trajectory_reward for t in trajectories] == [1.0, 0.0]  # no tool calls: the answer alone
    assert [t.steps[-1].reward for t in trajectories] == [1.0, 0.0]
    assert all(t.metrics["asked"] == 1 for t in trajectories)
    assert set(engine_loop) == {threading.get_ident()}  # awaited on the rollout's loop, no worker thread


async def test_an_async_reward_past_the_bound_is_cancelled_and_fails_only_its_trajectory(tokenizer):
    cancelled = anyio.Event()

    async def reward(task, messages):
        if "hang" in messages[-1]["content"]:
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.set()
        return 1.0

    spec = _spec(tokenizer, reward, reward_timeout_s=0.5)
    hung, fine = await run_tasks(
        [_task(0, "hang"), _task(1, "Paris")], lambda task, idx: run_trajectory(task, idx, spec), n_parallel_agents=2
    )
    assert cancelled.is_set()
    assert hung.failed and hung.termination_reason == TerminationReason.ERROR
    assert hung.error == "RewardError: the reward did not finish within reward_timeout_s=0.5"
    assert hung.metrics["reward_error"] == hung.error and hung.trajectory_reward == 0.0
    assert not fine.failed and fine.metrics["res_reward"] == 1.0
