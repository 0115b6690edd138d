"""Quiesce and resume: `Rollout.quiesce` stops at turn boundaries without interrupting a generation, hands back
queued and suspended work, and resuming gives the same trajectories as an uninterrupted run.

The first tests use `ScriptedEngine` (deterministic, no model) to control exactly where the pause lands; the last
two use the real vLLM engine with greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from support.engines import CountingEnvironment, DelegatingEngine, ForcedCallEngine, ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine, Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, TrajectoryCheckpoint
from agentic_rl.rollout.session import Rollout, SuspendedRollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

CALC = '<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}\n</tool_call>'


def three_turn_script(question: str, turn: int) -> str:
    """Two calculator calls, then an answer; the numbers depend on the question so trajectories differ."""
    n = int(question.split("#", 1)[1].split()[0])
    return CALC.format(a=n, b=turn + 2) if turn < 2 else f"The answer is {n * 6}."


class QuiesceAfter(DelegatingEngine):
    """Asks `rollout` to quiesce once `after` generations have returned (and counts starts and returns)."""

    def __init__(self, inner: Engine, after: int) -> None:
        super().__init__(inner)
        self.after = after
        self.rollout: Rollout | None = None
        self.started = 0
        self.returned = 0

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        self.started += 1
        generation = await self.inner.generate(prompt_ids, sampling)
        self.returned += 1
        if self.returned == self.after and self.rollout is not None:
            self.rollout.request_quiesce()
        return generation


class QuiesceAtTurn(DelegatingEngine):
    """Holds every request for turn `turn` until `parties` trajectories have asked for it, asks `rollout` to
    quiesce, then lets them all through: every one of them is then stopped at the next turn boundary, whatever
    order the tasks run in."""

    def __init__(self, inner: Engine, tokenizer: Any, *, turn: int, parties: int) -> None:
        super().__init__(inner)
        self.tokenizer, self.turn, self.parties = tokenizer, turn, parties
        self.rollout: Rollout | None = None
        self.arrived = 0
        self.release = anyio.Event()
        self.started = 0
        self.returned = 0

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        self.started += 1
        if self.tokenizer.decode(list(prompt_ids)).count("<|im_start|>assistant") - 1 == self.turn:
            self.arrived += 1
            if self.arrived == self.parties:
                assert self.rollout is not None
                self.rollout.request_quiesce()
                self.release.set()
            await self.release.wait()
        generation = await self.inner.generate(prompt_ids, sampling)
        self.returned += 1
        return generation


def _tasks(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "question": f"Task #{i + 2} asks for a product.", "ground_truth": str((i + 2) * 6)}
            for i in range(n)]  # fmt: skip


def _rollout(tokenizer, engine, *, n_parallel_agents: int, env=None, **config) -> Rollout:
    renderer = ChatRenderer(tokenizer)
    env = env or CountingEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    harness = HarnessConfig(**{"max_steps": 3, "max_prompt_length": 1024, "max_response_length": 512, **config})
    return Rollout(
        RolloutSpec(engine=engine, environment=env, renderer=renderer, config=harness, reward_fn=gsm8k_reward),
        n_parallel_agents=n_parallel_agents,
    )


def _record(t) -> tuple:
    return (t.idx, t.prompt_tokens.tolist(), t.response_tokens.tolist(), t.response_masks.tolist(),
            t.response_logprobs.tolist(), t.chat_completions, t.termination_reason, t.trajectory_reward, t.failed)  # fmt: skip


async def test_quiesce_hands_back_queued_and_suspended_work_and_resume_matches_an_uninterrupted_run(tokenizer):
    reference = await _rollout(tokenizer, ScriptedEngine(tokenizer, three_turn_script), n_parallel_agents=4).run(
        _tasks(10)
    )
    assert reference.suspended is None and len(reference.trajectories) == 10

    # quiesce once the 4 trajectories in flight have all asked for their second turn (of 3): none can finish first
    engine = QuiesceAtTurn(ScriptedEngine(tokenizer, three_turn_script), tokenizer, turn=1, parties=4)
    rollout = _rollout(tokenizer, engine, n_parallel_agents=4)
    engine.rollout = rollout
    first = await rollout.run(_tasks(10))

    suspended = first.suspended
    assert suspended is not None and first.trajectories == []
    assert engine.started == engine.returned == 8  # no generation was interrupted: 4 x 2 turns
    assert [idx for idx, _ in suspended.queued] == list(range(4, 10))  # never dispatched
    assert [cp.idx for cp in suspended.checkpoints] == [0, 1, 2, 3]
    for cp in suspended.checkpoints:
        assert isinstance(cp, TrajectoryCheckpoint)
        assert cp.turn == len(cp.steps) == 2  # stopped at a turn boundary, after whole turns
        assert cp.response_ids[-1] != tokenizer.convert_tokens_to_ids("<|im_end|>")  # ends with an observation
    assert rollout.spec.environment.closed == {}  # suspended environments stay open
    finished_first = {t.idx for t in first.trajectories}
    assert sorted(finished_first | set(suspended.indices)) == list(range(10))  # nothing lost
    assert finished_first.isdisjoint(suspended.indices)

    second = await rollout.resume(suspended)
    assert second.suspended is None
    resumed = sorted(first.trajectories + second.trajectories, key=lambda t: t.idx)
    assert [_record(t) for t in resumed] == [_record(t) for t in reference.trajectories]
    assert all(t.termination_reason == TerminationReason.ENV_DONE and not t.failed for t in resumed)
    assert all(t.metrics["alignment_mismatches"] == 0 for t in resumed)
    assert set(rollout.spec.environment.closed.values()) == {1} and len(rollout.spec.environment.closed) == 10


async def test_quiesce_from_another_task_waits_for_in_flight_turns(tokenizer):
    class SlowEngine(ScriptedEngine):
        async def generate(self, prompt_ids, sampling):
            await anyio.sleep(0.05)
            return await super().generate(prompt_ids, sampling)

    engine = QuiesceAfter(SlowEngine(tokenizer, three_turn_script), after=0)
    rollout = _rollout(tokenizer, engine, n_parallel_agents=3)
    results = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            results.append(await rollout.run(_tasks(5)))

        tg.start_soon(run)
        while engine.started < 3:  # three generations are in flight
            await anyio.sleep(0.005)
        suspended = await rollout.quiesce()

    assert not rollout.running
    assert engine.started == engine.returned == 3  # the in-flight turns finished; none started after the pause
    assert results[0].suspended is suspended
    assert [(cp.idx, cp.turn) for cp in suspended.checkpoints] == [(0, 1), (1, 1), (2, 1)]
    assert [idx for idx, _ in suspended.queued] == [3, 4]
    await rollout.discard(suspended)
    assert len(suspended) == 0
    assert sorted(rollout.spec.environment.closed.values()) == [1, 1, 1]
    assert await rollout.quiesce() == SuspendedRollout()  # idle: nothing to hand back


async def test_resume_across_a_weight_update_records_the_version_of_every_turn(tokenizer):
    inner = ScriptedEngine(tokenizer, three_turn_script)
    engine = QuiesceAfter(inner, after=1)
    rollout = _rollout(tokenizer, engine, n_parallel_agents=1)
    engine.rollout = rollout
    first = await rollout.run(_tasks(2))
    assert [cp.weight_versions for cp in first.suspended.checkpoints] == [[0]]

    inner.weight_version = 1  # what engine.update_weights does
    second = await rollout.resume(first.suspended)

    trajs = sorted(second.trajectories, key=lambda t: t.idx)
    assert [[s.info["weight_version"] for s in t.steps] for t in trajs] == [[0, 1, 1], [1, 1, 1]]
    assert [t.metrics["weight_version"] for t in trajs] == [0, 1]  # the oldest weights that sampled a turn


async def test_invalid_tasks_fail_alone_and_bad_arguments_are_named(tokenizer):
    with pytest.raises(ConfigError, match="n_parallel_agents"):
        _rollout(tokenizer, ScriptedEngine(tokenizer), n_parallel_agents=0)
    rollout = _rollout(tokenizer, ScriptedEngine(tokenizer, three_turn_script), n_parallel_agents=2)
    tasks = [_tasks(1)[0], {"id": 1, "question": "", "ground_truth": "1"}, "not a task"]
    result = await rollout.run(tasks)
    assert [t.failed for t in result.trajectories] == [False, True, True]
    assert result.trajectories[1].termination_reason == TerminationReason.INVALID_TASK
    assert "question" in result.trajectories[1].error and "dict" in result.trajectories[2].error


async def test_wrapper_make_rollout_uses_the_wrappers_engine_environment_and_settings(tokenizer):
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    wrapper = ToolAgentEngineWrapper("agent", tokenizer, {"max_tokens": 64}, 1024, 512, 2, 3, tools=[CalculatorTool()],
                                     engine=ScriptedEngine(tokenizer, three_turn_script), serve=False,
                                     turn_timeout_s=30)  # fmt: skip
    with pytest.raises(ConfigError, match="turn_timeout_s"):
        ToolAgentEngineWrapper("agent", tokenizer, engine=wrapper.engine, serve=False, turn_timeout_s=-1)
    with pytest.raises(ConfigError, match="initialize"):
        wrapper.make_rollout()
    wrapper.initialize()
    rollout = wrapper.make_rollout()
    assert rollout.n_parallel_agents == 2 and rollout.spec.config is wrapper.harness_config
    assert rollout.spec.config.turn_timeout_s == 30
    result = await rollout.run(_tasks(3))
    assert [(t.metrics["res_reward"], t.metrics["steps"]) for t in result.trajectories] == [(1.0, 3)] * 3
    wrapper.harness_config = wrapper.harness_config.model_copy(update={"max_steps": 1})
    assert wrapper.make_rollout().spec.config.max_steps == 1  # settings changed after initialize() apply


# ---------------------------------------------------------------------------------------------- real engine


class FreshPrefillEngine(DelegatingEngine):
    """Empties the engine's prefix cache before every request, so every turn is prefilled from scratch; also caps
    the turns that are not forced into a tool call at `free_turn_tokens` (they only need to be compared).

    Why the cache: on the CPU, a turn that reuses cached KV blocks reads values computed in an earlier request (some
    of them during decoding), while a fresh prefill computes them in one pass; bf16 results can differ in the last
    bits and flip a greedy choice. A weight update resets the cache, so without this the run resumed after an
    update would prefill where the uninterrupted run hit the cache. With it, and concurrency 1 (one sequence per
    engine step), both runs feed the engine identical batches.
    """

    def __init__(self, inner: Any, free_turn_tokens: int = 12) -> None:
        super().__init__(inner)
        self.free_turn_tokens = free_turn_tokens

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        assert await self.inner.call(lambda llm: llm.reset_prefix_cache())
        if sampling.structured_outputs is None:
            sampling = sampling.model_copy(update={"max_tokens": min(sampling.max_tokens, self.free_turn_tokens)})
        return await self.inner.generate(prompt_ids, sampling)


GREEDY = {"temperature": 0.0, "max_tokens": 40}  # a forced calculator call takes ~35 tokens
_REFERENCE: list[Any] = []  # the uninterrupted run, shared by the two tests below (generation is slow on a CPU)


def _real_engine(engine, tokenizer) -> ForcedCallEngine:
    """Turns 0 and 1 are forced calculator calls, turn 2 is free; greedy, so every run samples the same ids."""
    return ForcedCallEngine(FreshPrefillEngine(engine), tokenizer, forced_turns=2)


async def _real_reference(engine, tokenizer):
    """Two tasks, one at a time, without a pause. At concurrency 1 the first task's requests are the same whether
    the batch has one task or two, so the weight-update test compares its one task with the first of these."""
    if not _REFERENCE:
        result = await _rollout(tokenizer, _real_engine(engine, tokenizer), n_parallel_agents=1, sampling=GREEDY).run(
            _tasks(2)
        )
        _REFERENCE.extend(result.trajectories)
    return _REFERENCE


async def test_real_engine_quiesce_then_resume_gives_the_same_tokens_as_an_uninterrupted_run(engine, tokenizer):
    reference = await _real_reference(engine, tokenizer)
    assert [len(t.steps) for t in reference] == [3, 3]  # two forced calls, then a free turn

    counting = QuiesceAfter(_real_engine(engine, tokenizer), after=2)
    rollout = _rollout(tokenizer, counting, n_parallel_agents=1, sampling=GREEDY)
    counting.rollout = rollout
    first = await rollout.run(_tasks(2))
    assert [cp.turn for cp in first.suspended.checkpoints] == [2] and [i for i, _ in first.suspended.queued] == [1]
    second = await rollout.resume(first.suspended)

    assert first.trajectories == [] and second.suspended is None
    assert [_record(t) for t in second.trajectories] == [_record(t) for t in reference]


async def test_real_engine_resume_after_update_weights_carries_each_turns_weight_version(engine, tokenizer, model_dir):
    from safetensors.torch import load_file

    reference = await _real_reference(engine, tokenizer)
    version = engine.weight_version
    counting = QuiesceAfter(_real_engine(engine, tokenizer), after=1)
    rollout = _rollout(tokenizer, counting, n_parallel_agents=1, sampling=GREEDY)
    counting.rollout = rollout
    first = await rollout.run(_tasks(1))
    assert [cp.weight_versions for cp in first.suspended.checkpoints] == [[version]]

    await engine.update_weights(load_file(str(model_dir / "model.safetensors")).items())  # the same weights again
    assert engine.weight_version == version + 1
    second = await rollout.resume(first.suspended)

    (traj,) = second.trajectories
    assert [s.info["weight_version"] for s in traj.steps] == [version, version + 1, version + 1]
    assert traj.metrics["weight_version"] == version
    # The reloaded weights are the original ones, so the tokens also match the uninterrupted run.
    assert _record(traj) == _record(reference[0])
