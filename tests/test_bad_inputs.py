"""Bad inputs at the public entry points: a clear error naming the problem, and nothing crashes a sibling.

Tasks and wrapper arguments are covered in `tests/rollout/test_wrapper.py`, sandbox arguments in
`tests/tools/test_sandbox.py`, malformed tool calls in `tests/test_parser.py`, trajectory tensors in
`tests/test_types.py`; this file covers the rest.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from support.engines import ScriptedEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Generation
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import (
    ConfigError,
    RequestError,
    TrajectoryError,
)
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.train.loss import grpo_loss


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_steps", 0), ("max_steps", 2.5), ("max_steps", True), ("max_prompt_length", -1),
     ("max_response_length", "8"), ("sampling", None), ("toolcall_weight", math.nan), ("unfinished_penalty", -0.5), ("turn_timeout_s", 0),
     ("turn_timeout_s", math.inf), ("close_timeout_s", -1.0), ("check_alignment", "yes")],
)  # fmt: skip
def test_harness_config_rejects_each_bad_field_by_name(field, value):
    with pytest.raises(ConfigError, match=rf"HarnessConfig\.{field}="):
        HarnessConfig(**{field: value})


async def test_run_tasks_rejects_a_bad_concurrency_by_name():
    async def one(task, idx):
        return task

    with pytest.raises(ConfigError, match="n_parallel_agents"):
        await run_tasks([1], one, n_parallel_agents=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_observation_chars": 0}, "max_observation_chars"), ({"max_tool_threads": 1.5}, "max_tool_threads"),
     ({"tools": ["calculator"]}, "Tool instances")],
)  # fmt: skip
def test_tool_environment_rejects_bad_arguments_by_name(kwargs, match):
    tools = kwargs.pop("tools", [CalculatorTool()])
    with pytest.raises(ConfigError, match=match):
        ToolEnvironment(tools, **kwargs)


class NaNLogprobEngine(ScriptedEngine):
    """Reports a NaN logprob for the questions that ask for it (a broken engine or a bad logprobs mode)."""

    async def generate(self, prompt_ids, sampling):
        generation = await super().generate(prompt_ids, sampling)
        if "[nan]" in self.tokenizer.decode(list(prompt_ids)):
            return Generation(generation.token_ids, [math.nan] * len(generation.token_ids), generation.finish_reason)
        return generation


async def test_engine_reporting_nan_logprobs_fails_only_that_trajectory(tokenizer):
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=True)
    engine = NaNLogprobEngine(tokenizer)
    config = HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=1024)
    tasks = [{"id": i, "question": f"What is 12 * 7? {'[nan]' if i == 1 else ''}", "ground_truth": "84"}
             for i in range(3)]  # fmt: skip

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config)
        )

    trajs = await run_tasks(tasks, one, n_parallel_agents=3)

    assert [t.failed for t in trajs] == [False, True, False]
    assert trajs[1].termination_reason == TerminationReason.ERROR
    assert trajs[1].error.startswith("TrajectoryError: response_logprobs contains")
    # the ids stay (counted as sampled and excluded), the invalid logprobs do not; the turns stay for inspection
    assert trajs[1].response_logprobs is None and trajs[1].num_generated_tokens > 0 and len(trajs[1].steps) == 2
    assert all(any(step.run is run for run in trajs[1].runs or trajs[1].token_runs()) for step in trajs[1].steps)


def _loss_inputs() -> dict[str, Any]:
    return {"new_logprobs": torch.full((2, 3), -1.0), "old_logprobs": torch.full((2, 3), -1.1),
            "advantages": torch.tensor([1.0, -1.0]), "response_mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
            "ref_logprobs": torch.full((2, 3), -1.0)}  # fmt: skip


@pytest.mark.parametrize("name", ["old_logprobs", "advantages", "ref_logprobs", "new_logprobs"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_grpo_loss_names_the_tensor_holding_nan_or_inf(name, bad):
    inputs = _loss_inputs()
    inputs[name][0, ...] = bad
    with pytest.raises(TrajectoryError, match=name):
        grpo_loss(**inputs, kl_coef=0.1)


def test_grpo_loss_ignores_non_finite_new_logprobs_outside_the_response_mask():
    inputs = _loss_inputs()
    inputs["new_logprobs"][1, 2] = math.nan  # padding: the policy's value there is never used
    out = grpo_loss(**inputs, kl_coef=0.1)
    assert torch.isfinite(out.loss)


def test_grpo_loss_rejects_mismatched_shapes_by_name():
    inputs = _loss_inputs()
    inputs["advantages"] = torch.ones(3)
    with pytest.raises(TrajectoryError, match="advantages"):
        grpo_loss(**inputs)


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", math.nan), ("top_p", math.inf), ("max_tokens", 0), ("n", 0), ("logprobs", 21)],
)
async def test_server_request_with_a_bad_sampling_value_is_a_400_naming_the_field(tokenizer, field, value):
    serving = OpenAIServing(ScriptedEngine(tokenizer), tokenizer, model_name="m")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    with pytest.raises(RequestError, match=field) as info:
        await serving.handle(body)
    assert info.value.status == 400


async def test_server_request_of_the_wrong_shape_is_a_400(tokenizer):
    serving = OpenAIServing(ScriptedEngine(tokenizer), tokenizer, model_name="m")
    for body in [["not", "an", "object"], {"model": "m"}, {"model": "m", "messages": "hi"}]:
        with pytest.raises(RequestError) as info:
            await serving.handle(body)
        assert info.value.status == 400
