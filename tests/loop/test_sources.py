"""What a training run rolls out with (`agentic_rl.loop.sources`): a user's agent behind `AgentRollout`, a
user's environment or tools under the harness, and the gate that refuses records the engine did not sample. A
scripted engine stands in for vLLM here; tests/test_loop_custom.py trains the real thing."""

from __future__ import annotations

from typing import Any

import pytest
from support.engines import ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.ledger import RecordingEngine, SampleLedger
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Environment, Sample
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.loop.sources import AgentRollout, SpecRollout, build_training_rollout, refuse_untrainable
from agentic_rl.plugins import PluginRef
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec
from agentic_rl.rollout.wrapper import BaseEngineWrapper
from agentic_rl.types import TokenRun, Trajectory

HARNESS = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=256,
                        sampling=SamplingConfig(temperature=0.7, max_tokens=32))  # fmt: skip
TASKS = [{"id": i // 2, "question": f"What is {i} + 1?", "ground_truth": str(i + 1)} for i in range(4)]


class BatchAgent(BaseEngineWrapper):
    """An AgentSDK-style agent (a plain `generate_agent_trajectories_async`) that samples one turn per task from its
    engine and records the run exactly, or returns what `mode` says."""

    mode = "exact"

    def initialize(self) -> None:
        self.initialized_with = self.engine

    async def generate_agent_trajectories_async(self, tasks):
        self.seen_sampling = dict(self.sampling_params)
        out: list[Any] = []
        for i, task in enumerate(tasks):
            prompt = self.renderer.prompt_ids([{"role": "user", "content": task["question"]}])
            g = await self.engine.generate(prompt, SamplingConfig.of(self.sampling_params))
            run = TokenRun(prompt, list(g.token_ids), [1] * len(g.token_ids), list(g.logprobs), None)
            out.append(Trajectory.from_runs([run], idx=i, trajectory_reward=float(i)))
        if self.mode == "short":
            return out[:-1]
        if self.mode == "junk":
            out[1] = {"not": "a trajectory"}
        return out


def _agent_rollout(tokenizer, mode: str = "exact") -> AgentRollout:
    ref = PluginRef(path=f"{__name__}:BatchAgent")
    rollout = build_training_rollout(ScriptedEngine(tokenizer), ChatRenderer(tokenizer), tokenizer, harness=HARNESS,
                                     n_parallel_agents=4, tools=[], reward_fn=None, agent=ref)  # fmt: skip
    assert isinstance(rollout, AgentRollout)
    rollout.agent.mode = mode
    return rollout


async def test_an_agent_gets_the_recording_engine_the_settings_and_each_rollouts_sampling(tokenizer):
    rollout = _agent_rollout(tokenizer)
    agent = rollout.agent
    assert isinstance(agent.initialized_with, RecordingEngine) and agent.engines == [agent.initialized_with]
    assert (agent.agent_name, agent.max_steps, agent.max_prompt_length, agent.n_parallel_agents) == ("BatchAgent", 2, 1024, 4)
    assert agent.sampling_params == {**SamplingConfig(temperature=0.7, max_tokens=32).model_dump(exclude_none=True)}
    out = await rollout.run(TASKS, SamplingConfig(temperature=0.0, max_tokens=8, seed=5))
    assert agent.seen_sampling["seed"] == 5 and agent.seen_sampling["temperature"] == 0.0
    assert [t.idx for t in out] == [0, 1, 2, 3]
    assert refuse_untrainable(out, rollout.ledger) == 0
    assert all(t.runs[0].weight_versions == [0] * len(t.runs[0].response_ids) for t in out)  # filled from the ledger


async def test_records_the_engine_did_not_sample_are_refused_with_the_reason(tokenizer):
    rollout = _agent_rollout(tokenizer)
    out = await rollout.run(TASKS, HARNESS.sampling)
    out[0].runs[0].response_ids[1] += 1  # a token the engine did not sample
    out[0] = Trajectory.from_runs(out[0].runs, idx=0)
    out[1] = Trajectory.from_runs([TokenRun(out[1].runs[0].prompt_ids, out[1].runs[0].response_ids,
                                            out[1].runs[0].response_mask, None, None)], idx=1)  # no logprobs
    out[2].failed = True  # failed already: not trained, not refused
    assert refuse_untrainable(out, rollout.ledger) == 2
    assert [t.failed for t in out] == [True, True, True, False]
    assert "the engine sampled" in out[0].refused and out[0].error.startswith("refused for training: ")
    assert out[1].refused.startswith("no logprobs")
    assert out[2].refused is None


async def test_an_agent_that_returns_junk_loses_that_record_only(tokenizer):
    out = await _agent_rollout(tokenizer, "junk").run(TASKS, HARNESS.sampling)
    assert out[1].failed and "returned dict, not a Trajectory" in out[1].refused
    assert not any(t.failed for i, t in enumerate(out) if i != 1)


async def test_an_agent_that_returns_too_few_trajectories_stops_the_run(tokenizer):
    with pytest.raises(TrainingError, match="returned 3 trajectories for 4 tasks"):
        await _agent_rollout(tokenizer, "short").run(TASKS, HARNESS.sampling)


class NeedsNothing(Environment):
    def __init__(self, greeting: str = "hi") -> None:
        self.greeting = greeting

    async def reset(self, request: dict[str, Any]) -> Sample:
        return Sample(id=request["trajectory_id"], task=request,
                      messages=[{"role": "user", "content": f"{self.greeting} {request['question']}"}])  # fmt: skip

    async def step(self, sample: Sample) -> tuple[Any, bool, dict[str, Any]]:
        return None, True, {}


class TakesTools(NeedsNothing):
    def __init__(self, tools: list[Any]) -> None:
        super().__init__()
        self.tools = tools


class MyToolEnvironment(ToolEnvironment):
    pass


def _spec_rollout(tokenizer, **kwargs: Any) -> SpecRollout:
    rollout = build_training_rollout(ScriptedEngine(tokenizer), ChatRenderer(tokenizer), tokenizer, harness=HARNESS,
                                     n_parallel_agents=2, reward_fn=None, **kwargs)  # fmt: skip
    assert isinstance(rollout, SpecRollout) and isinstance(rollout.spec, RolloutSpec)
    return rollout


def test_user_environments_get_their_kwargs_and_tools_when_they_take_them(tokenizer):
    env = _spec_rollout(tokenizer, tools=[], environment=PluginRef(path=f"{__name__}:NeedsNothing",
                                                                   kwargs={"greeting": "hello"})).spec.environment  # fmt: skip
    assert isinstance(env, NeedsNothing) and env.greeting == "hello"
    env = _spec_rollout(tokenizer, tools=["calculator"], environment=PluginRef(path=f"{__name__}:TakesTools")).spec.environment
    assert [t.name for t in env.tools] == ["calculator"]
    env = _spec_rollout(tokenizer, tools=["calculator"], environment=PluginRef(path=f"{__name__}:MyToolEnvironment")).spec.environment
    assert isinstance(env, MyToolEnvironment) and list(env.tools) == ["calculator"]
    with pytest.raises(ConfigError, match=r"environment '.*:NeedsNothing' takes no 'tools' argument"):
        _spec_rollout(tokenizer, tools=["calculator"], environment=PluginRef(path=f"{__name__}:NeedsNothing"))
    with pytest.raises(ConfigError, match=r"could not be built with kwargs \{'colour': 1\}: TypeError"):
        _spec_rollout(tokenizer, tools=[], environment=PluginRef(path=f"{__name__}:NeedsNothing", kwargs={"colour": 1}))


async def test_the_harness_over_a_user_environment_passes_the_gate(tokenizer):
    rollout = _spec_rollout(tokenizer, tools=[], environment=PluginRef(path=f"{__name__}:NeedsNothing"))
    out = await rollout.run(TASKS, HARNESS.sampling)
    assert not any(t.failed for t in out)
    assert refuse_untrainable(out, rollout.ledger) == 0


class FailsToInitialize(BatchAgent):
    def initialize(self) -> None:
        raise RuntimeError("no GPU here")


def test_an_agent_whose_initialize_raises_is_named(tokenizer):
    with pytest.raises(ConfigError, match=r"agent '.*:FailsToInitialize': initialize\(\) failed: RuntimeError: no GPU"):
        build_training_rollout(ScriptedEngine(tokenizer), ChatRenderer(tokenizer), tokenizer, harness=HARNESS,
                               n_parallel_agents=1, tools=[], reward_fn=None,
                               agent=PluginRef(path=f"{__name__}:FailsToInitialize"))  # fmt: skip


def test_a_ledger_is_fresh_per_rollout_source(tokenizer):
    assert len(_agent_rollout(tokenizer).ledger) == 0 and isinstance(SampleLedger(), SampleLedger)
