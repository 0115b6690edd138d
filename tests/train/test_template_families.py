"""Every model family's chat template that can train does: a three-turn tool exchange (two calls in the family's own
tool-call format, then an answer) through the rollout harness and a GRPO step on the result.

Templates that append every turn give one exact run per trajectory; templates that rewrite history (QwQ, the
DeepSeek-R1 distills, Hermes-3's `tool_use`, a Qwen3.5-style template) give one run per turn, each prompted with the
template's own render of the conversation. The families' control tokens are not in SmolLM2's vocabulary, so the
turns come from a scripted engine (token ids of fixed text, a fixed logprob) and the step trains the tiny random
SmolLM2 with its embeddings grown to the family's tokenizer.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
import torch
from support.chat_templates import TRAINABLE, family_tokenizer

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Generation
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.parser import format_tool_call, parse_tool_calls, tool_call_format
from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

RESULTS = {"12 * 7": "tool-result-one", "84 + 5": "tool-result-two"}


class MarkedCalculator(CalculatorTool):
    """The calculator's schema; answers with a marker per expression (so the engine can tell the turn) and counts."""

    def __init__(self) -> None:
        super().__init__()
        self.executed: list[str] = []

    def execute(self, arguments: dict[str, Any]) -> str:
        self.executed.append(arguments["expression"])
        return RESULTS.get(arguments["expression"], "unknown")


class FamilyEngine:
    """Writes the exchange in the family's format: a call of 12 * 7, then of 84 + 5, then the answer (reasoning in
    a `<think>` block first for families that think; only its end when the generation prompt opened it)."""

    def __init__(self, renderer: ChatRenderer, thinks: bool) -> None:
        self.renderer, self.thinks = renderer, thinks
        self.call_format = tool_call_format(renderer.tokenizer.chat_template)
        self.weight_version = 0
        self.prompts: list[list[int]] = []

    @property
    def max_model_len(self) -> int:
        return 8192

    async def generate(self, prompt_ids: Sequence[int], sampling: Any) -> Generation:
        await anyio.sleep(0)
        self.prompts.append(list(prompt_ids))
        prompt = self.renderer.decode(prompt_ids)
        if RESULTS["84 + 5"] in prompt:
            text = "12 * 7 + 5 = 89. The answer is 89."
        else:
            expression = "84 + 5" if RESULTS["12 * 7"] in prompt else "12 * 7"
            text = format_tool_call("calculator", {"expression": expression}, self.call_format)
        if prompt.endswith("<think>\n"):
            text = "Multiply first, then add.\n</think>\n\n" + text
        elif self.thinks:
            text = "<think>\nMultiply first, then add.\n</think>\n\n" + text
        ids = [*self.renderer.encode(text), self.renderer.end_of_turn_id]
        return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop")


async def _exchange(family, tok, idx: int):
    renderer = ChatRenderer(tok, history_rewrites=True)
    engine = FamilyEngine(renderer, family.thinks)
    calculator = MarkedCalculator()
    config = HarnessConfig(max_steps=4, max_prompt_length=4096, max_response_length=4096)
    spec = RolloutSpec(engine, ToolEnvironment.for_renderer([calculator], renderer), renderer, config)
    task = {"id": "t", "question": "What is 12 * 7 + 5? Use the calculator.", "ground_truth": "89"}
    return await run_trajectory(task, idx, spec), engine, calculator, renderer


@pytest.mark.parametrize("family", TRAINABLE, ids=lambda f: f.name)
async def test_a_three_turn_tool_exchange_rolls_out_and_trains_in_every_trainable_family(family, tokenizer, tiny):
    tok = family_tokenizer(tokenizer, family)
    trajectory, engine, calculator, renderer = await _exchange(family, tok, 0)

    assert not trajectory.failed, trajectory.error
    assert calculator.executed == ["12 * 7", "84 + 5"]  # each call read in the family's format, run once
    assert len(trajectory.steps) == 3 and trajectory.metrics["alignment_mismatches"] == 0
    assert len(trajectory.runs) == (3 if family.rewrites else 1)
    for step in trajectory.steps[:2]:  # the recorded action is the call, as the family writes it
        assert [c.name for c in parse_tool_calls(step.action, call_format=engine.call_format)] == ["calculator"]
    assistant_at = [k for k, m in enumerate(trajectory.chat_completions) if m["role"] == "assistant"]
    tools = ToolEnvironment([CalculatorTool()]).schemas
    for turn, prompt in enumerate(engine.prompts):  # every prompt is the template's own render of the history
        history = trajectory.chat_completions[: assistant_at[turn]]
        assert renderer.decode(prompt) == renderer.render(history, tools, add_generation_prompt=True)
    for tool_result in RESULTS.values():
        assert tool_result in renderer.decode(engine.prompts[-1])

    second, _, _, _ = await _exchange(family, tok, 1)
    trajectory.trajectory_reward, second.trajectory_reward = 1.0, 0.0  # one group, two outcomes
    for t in (trajectory, second):
        for step in t.steps:
            step.reward = t.trajectory_reward
    model = copy.deepcopy(tiny)
    model.resize_token_embeddings(len(tok))
    for mode in ("trajectory", "step"):
        torch.manual_seed(0)
        trainer = GRPOTrainer(copy.deepcopy(model), pad_token_id=tok.pad_token_id or 0,
                              config=GRPOConfig(lr=1e-4, advantage=mode, micro_batch_size=4))  # fmt: skip
        metrics = trainer.train_step([trajectory, second]).as_metrics()
        sampled = trajectory.num_generated_tokens + second.num_generated_tokens
        assert metrics["tokens_trained"] == metrics["tokens_sampled"] == sampled
        assert metrics["valid_rows"] == (6 if mode == "step" else 2 * len(trajectory.runs))
        assert 0 < metrics["grad_norm"] < float("inf")
