"""Every reward call is bounded in wall-clock time: a reward that never returns fails its own trajectory (a reward
error, never trained on), its siblings finish, cancellation does not wait for it, and the rollout goes on.

math-verify runs in worker processes (`agentic_rl.rewards.pool`) killed past their bound; any other reward is
waited for at most `HarnessConfig.reward_timeout_s`. The tests show each bound by what returns first (or at all),
never by timing it: elapsed seconds are only printed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
from support.engines import CountingEnvironment, ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.errors import RewardError
from agentic_rl.rewards import math as rewards  # math_reward and the MATH_VERIFY_TIMEOUT_S it reads
from agentic_rl.rewards.pool import ProcessReward, RewardProcessPool
from agentic_rl.rewards.worker import math_verify_score
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.train.packing import exclusion_reason

NESTED_POWER = r"\boxed{2^{2^{2^{2^{2^{2}}}}}}"  # math-verify's comparison with it never ends
FAILSAFE_S = 300  # only so that a regression fails the test instead of hanging it


def sleep_forever(*args: Any) -> None:
    """A worker-process target that never returns."""
    while True:
        time.sleep(60)


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `fn` in a thread; the dict gets its `result` or `error`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn(*args, **kwargs)
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def pool():
    pool = RewardProcessPool(("math_verify",), max_workers=2)
    yield pool
    pool.close()


def test_math_verify_on_a_nested_power_fails_within_its_bound_and_the_worker_is_replaced(pool):
    assert pool.call("math_verify", ("12", ["12"]), timeout_s=60) == 1.0  # a worker is up
    started = time.perf_counter()
    thread, out = _in_thread(pool.call, "math_verify", (NESTED_POWER, ["12"]), timeout_s=1.0)
    thread.join(FAILSAFE_S)
    assert not thread.is_alive(), "the bounded call never returned"
    print(f"nested power: RewardError after {time.perf_counter() - started:.1f} s")
    assert isinstance(out["error"], RewardError)
    assert "did not finish within 1 s (its worker process was killed)" in str(out["error"])
    assert pool.live_workers == 0  # the hung worker is gone ...
    assert pool.call("math_verify", ("+12", ["12"]), timeout_s=60) == 0.0  # ... and replaced (math-verify: no '+')
    assert pool.call("math_verify", ("\\frac{28}{6}", ["\\frac{14}{3}"]), timeout_s=60) == 1.0
    assert pool.live_workers == 1


def test_a_hung_worker_leaves_its_sibling_calls_alone_and_close_ends_it(pool):
    hung, out = _in_thread(pool.call, f"{__name__}:sleep_forever", (), timeout_s=3600)
    answers = [pool.call("math_verify", (str(n), [str(n)]), timeout_s=60) for n in range(5)]  # the other worker
    assert answers == [1.0] * 5
    assert hung.is_alive()  # still in its call (a bound of an hour): the siblings did not wait for it
    pool.close()
    hung.join(FAILSAFE_S)
    assert not hung.is_alive() and isinstance(out["error"], RewardError)
    with pytest.raises(RewardError, match="closed"):
        pool.call("math_verify", ("1", ["1"]), timeout_s=60)


def test_worker_errors_are_reward_errors_and_the_worker_serves_on(pool):
    with pytest.raises(RewardError, match="cannot parse the ground truth"):
        pool.call("math_verify", ("12", ["\\frac{"]), timeout_s=60)
    with pytest.raises(RewardError, match="ModuleNotFoundError"):
        pool.call("no_such_module_here:fn", (), timeout_s=60)
    assert pool.call("math_verify", ("12", ["12"]), timeout_s=60) == 1.0
    assert pool.live_workers == 1


def test_math_verify_scorer_reads_its_ground_truth_spellings_in_order():
    assert math_verify_score("\\frac{1}{2}", ["0.5"]) == 1.0
    assert math_verify_score("3", ["not math at all \\frac{", "3"]) == 1.0
    assert math_verify_score("no answer", ["3"]) == 0.0


def test_math_reward_on_a_nested_power_is_a_reward_error(monkeypatch):
    monkeypatch.setattr(rewards, "MATH_VERIFY_TIMEOUT_S", 1.0)
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"So {NESTED_POWER}."}]
    thread, out = _in_thread(rewards.math_reward, {"ground_truth": "12"}, chat)
    thread.join(FAILSAFE_S)
    assert not thread.is_alive() and isinstance(out["error"], RewardError)
    assert "math_verify did not finish within 1 s" in str(out["error"])


# ---- through the harness ------------------------------------------------------------------------------------------


def _answers(question: str, turn: int) -> str:
    """The scripted model's one turn: the text after `answer=` in the question."""
    return question.split("answer=", 1)[1]


def _spec(tokenizer: Any, reward_fn: Any, **config: Any) -> tuple[RolloutSpec, CountingEnvironment]:
    env = CountingEnvironment([CalculatorTool()])
    harness = HarnessConfig(max_steps=2, max_prompt_length=2048, max_response_length=1024, **config)
    spec = RolloutSpec(engine=ScriptedEngine(tokenizer, _answers), environment=env, renderer=ChatRenderer(tokenizer),
                       config=harness, reward_fn=reward_fn)  # fmt: skip
    return spec, env


def _task(i: int, answer: str) -> dict[str, Any]:
    return {"id": i, "question": f"What is 3 * 4? answer={answer}", "ground_truth": "12"}


async def test_a_reward_that_never_returns_fails_only_its_trajectory_with_a_reward_error(tokenizer):
    release = threading.Event()

    def reward(task: dict[str, Any], messages: list[dict[str, str]]) -> float:
        if "hang" in messages[-1]["content"]:
            release.wait()  # a thread that nothing can stop, until the test ends
        return 1.0

    spec, env = _spec(tokenizer, reward, reward_timeout_s=0.5)
    try:
        trajectories = await run_tasks([_task(0, "hang"), _task(1, "12"), _task(2, "12")],
                                       lambda task, idx: run_trajectory(task, idx, spec), n_parallel_agents=3)  # fmt: skip
    finally:
        release.set()
    hung, *siblings = trajectories
    assert hung.failed and hung.termination_reason == TerminationReason.ERROR
    assert hung.error == "RewardError: the reward did not finish within reward_timeout_s=0.5"
    assert hung.metrics["reward_error"] == hung.error and hung.metrics["res_reward"] == 0.0
    assert exclusion_reason(hung) == "failed"  # never trained on: a hung reward is not a real 0
    scored = [(t.failed, t.metrics["res_reward"], "reward_error" in t.metrics) for t in siblings]
    assert scored == [(False, 1.0, False)] * 2
    # A reward that failed is not the policy's doing: the trajectory was rolled out again (the default 2 retries, each
    # attempt closed once) and still failed, with its kind.
    assert hung.failure_kind == "reward" and hung.metrics["retries_reward"] == 2
    assert sorted(env.closed.values()) == [1] * 5


async def test_math_reward_on_a_nested_power_fails_its_trajectory_and_siblings_score(tokenizer, monkeypatch):
    monkeypatch.setattr(rewards, "MATH_VERIFY_TIMEOUT_S", 1.0)
    spec, env = _spec(tokenizer, rewards.math_reward)
    tasks = [_task(0, NESTED_POWER), _task(1, "The answer is \\boxed{12}."), _task(2, "The answer is +12.")]
    started = time.perf_counter()
    trajectories = await run_tasks(tasks, lambda task, idx: run_trajectory(task, idx, spec), n_parallel_agents=3)
    print(f"rollout with a nested-power answer: {time.perf_counter() - started:.1f} s")
    hung, *siblings = trajectories
    assert hung.failed and "RewardError: math_verify did not finish within 1 s" in hung.error
    assert hung.metrics["reward_error"] == hung.error and exclusion_reason(hung) == "failed"
    assert [(t.failed, t.metrics["res_reward"]) for t in siblings] == [(False, 1.0), (False, 1.0)]
    assert hung.failure_kind == "reward" and hung.metrics["retries_reward"] == 2
    assert sorted(env.closed.values()) == [1] * 5


async def test_cancelling_a_rollout_while_its_reward_runs_does_not_wait_for_the_reward(tokenizer):
    entered, release = threading.Event(), threading.Event()

    def reward(task: dict[str, Any], messages: list[dict[str, str]]) -> float:
        entered.set()
        release.wait()
        return 1.0

    spec, env = _spec(tokenizer, reward, reward_timeout_s=3600)  # the bound is not what ends it
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(run_trajectory, _task(0, "12"), 0, spec)
            await anyio.to_thread.run_sync(entered.wait)  # the reward is running
            group.cancel_scope.cancel()
        assert not release.is_set()  # the cancelled rollout returned while its reward still ran
    finally:
        release.set()
    assert list(env.closed.values()) == [1]


def test_reward_timeout_is_a_positive_finite_number():
    from agentic_rl.errors import ConfigError

    assert HarnessConfig().reward_timeout_s == 60.0
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="reward_timeout_s"):
            HarnessConfig(reward_timeout_s=bad)


def reward_of_length(task: dict[str, Any], messages: list[dict[str, str]]) -> float:
    """A worker-process reward: the final message's length, or forever for a message that says so."""
    if messages[-1]["content"] == "forever":
        sleep_forever()
    return float(len(messages[-1]["content"]))


def test_a_process_reward_of_ones_own_is_killed_past_its_bound_and_serves_on():
    from agentic_rl.errors import ConfigError

    reward = ProcessReward(f"{__name__}:reward_of_length", timeout_s=1.0)
    assert reward({"id": 0}, [{"role": "assistant", "content": "four"}]) == 4.0
    thread, out = _in_thread(reward, {"id": 1}, [{"role": "assistant", "content": "forever"}])
    thread.join(FAILSAFE_S)
    assert not thread.is_alive() and "did not finish within 1 s" in str(out["error"])
    assert reward({"id": 2}, [{"role": "assistant", "content": "12"}]) == 2.0  # a new worker
    with pytest.raises(ConfigError, match="package.module:function"):
        ProcessReward("no_colon")


async def test_cancelling_a_rollout_while_math_verify_runs_away_does_not_wait_for_it(tokenizer, pool, monkeypatch):
    from agentic_rl.rewards import pool as reward_pool

    monkeypatch.setattr(reward_pool, "math_verify_pool", lambda: pool)
    monkeypatch.setattr(rewards, "MATH_VERIFY_TIMEOUT_S", 3600.0)  # neither bound is what ends it
    entered, finished = threading.Event(), threading.Event()

    def reward(task: dict[str, Any], messages: list[dict[str, str]]) -> float:
        entered.set()
        try:
            return rewards.math_reward(task, messages)
        finally:
            finished.set()

    spec, env = _spec(tokenizer, reward, reward_timeout_s=3600)
    async with anyio.create_task_group() as group:
        group.start_soon(run_trajectory, _task(0, NESTED_POWER), 0, spec)
        await anyio.to_thread.run_sync(entered.wait)
        group.cancel_scope.cancel()
    assert not finished.is_set()  # the rollout returned while math-verify still ran
    assert list(env.closed.values()) == [1]
    pool.close()  # kills the runaway worker: the abandoned thread ends
    await anyio.to_thread.run_sync(finished.wait, FAILSAFE_S)
    assert finished.is_set()
