"""A GRPO step on trajectories of several exact runs, made by templates that rewrite history (QwQ, a Qwen3.5-style
template): every turn trains as sampled after exactly its own prompt, in step mode (one row per turn) and in
trajectory mode (one row per run), with exact token accounting.

The turns are sampled freely (each ends at a common word, after at least one recorded token) (no constrained decoding: its logprobs are those of the constrained distribution, which
the trainer's forward does not reproduce), and the environment answers every turn with a tool result, so each
trajectory has three turns whatever the model writes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from support.engines import RecordingEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.harness import HarnessConfig
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.train.turn_rows import step_units

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "templates"


class ResultEveryTurn(Environment):
    """The calculator's environment, except that every turn gets a tool result and the trajectory goes on."""

    def __init__(self) -> None:
        self.inner = ToolEnvironment([CalculatorTool()])

    async def reset(self, request: dict) -> Sample:
        return await self.inner.reset(request)

    async def step(self, sample: Sample) -> StepResult:
        turn = sum(m["role"] == "assistant" for m in sample.messages)
        return StepResult(observation=[{"role": "tool", "content": f"result {turn}"}], done=False)

    async def close(self, sample: Sample) -> None:
        await self.inner.close(sample)


async def _rollout(engine, tokenizer, template: str):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (TEMPLATES / template).read_text()
    renderer = ChatRenderer(tok, history_rewrites=True)
    recording = RecordingEngine(engine)
    stops = sorted({tok.convert_tokens_to_ids(t) for t in (".", ",", "Ċ", "Ġthe", "Ġa", "ĠI", "Ġto", "Ġis")})
    config = HarnessConfig(max_steps=3, max_prompt_length=1024, max_response_length=768,
                           sampling={"temperature": 1.0, "max_tokens": 24, "min_tokens": 2, "seed": 5,
                                     "stop_token_ids": stops})  # fmt: skip
    spec = RolloutSpec(recording, ResultEveryTurn(), renderer, config, reward_fn=gsm8k_reward)
    tasks = [{"id": "mul", "question": "What is 12 * 7? Use the calculator.", "ground_truth": "84"}] * 2
    trajectories = list((await Rollout(spec, n_parallel_agents=2).run(tasks)).trajectories)
    for t in trajectories:  # rewards that differ within the group, per turn too (GRPO needs a spread)
        t.trajectory_reward = float(t.idx % 2)
        for k, step in enumerate(t.steps):
            step.reward = t.trajectory_reward if k == len(t.steps) - 1 else 0.1 * t.idx
    return trajectories, recording


def _train(model, tokenizer, trajectories, **config) -> dict:
    torch.manual_seed(0)
    trainer = GRPOTrainer(model, pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(lr=1e-4, **config))
    return trainer.train_step(trajectories).as_metrics()


@pytest.mark.parametrize(("template", "mode"), [("Qwen-QwQ-32B.jinja", "step"), ("qwen3.5-style.jinja", "trajectory")],
                         ids=["QwQ-step", "Qwen3.5-style-trajectory"])  # fmt: skip
async def test_a_trajectory_of_several_runs_trains_each_turn_on_its_exact_prompt(fp32_engine, tokenizer, hf_model,
                                                                                 template, mode):  # fmt: skip
    trajectories, recording = await _rollout(fp32_engine, tokenizer, template)
    errors = [t.error for t in trajectories if t.failed]
    assert not errors, errors
    assert all(len(t.runs) == len(t.steps) for t in trajectories)  # each turn its own run (a cut turn ends one)
    assert any(len(t.runs) > 1 for t in trajectories)  # turns end at a common word: a cut one is rare
    sampled: dict[tuple[int, ...], list] = {}  # the group's first turns share their prompt
    for prompt, _, generation in recording.calls:
        sampled.setdefault(tuple(prompt), []).append(generation)

    units = step_units(trajectories, gamma=1.0)
    batch = pack_trajectories(units.units, pad_token_id=tokenizer.pad_token_id, group_ids=units.group_ids)
    for row, (owner, turn) in enumerate(zip(units.owners, units.turns, strict=True)):
        step = trajectories[owner].steps[turn]  # this row is the turn's own run: its prompt, its sampled ids
        n = len(step.response_ids)
        matches = [g for g in sampled[tuple(step.prompt_ids)] if g.token_ids[:n] == step.response_ids]
        assert matches and n > 0  # identical samples of one prompt have identical logprobs too
        generation = matches[0]
        mask = batch.response_mask[row].bool()
        assert batch.responses[row][mask].tolist() == step.response_ids
        assert batch.old_logprobs[row][mask].tolist() == pytest.approx(generation.logprobs[:n])

    generated = sum(t.num_generated_tokens for t in trajectories)
    # off-policy correction per run (the default truncated weight; a sequence-level mask, each run a sequence)
    off_policy = {"correction": "mask", "mask_level": "sequence"} if mode == "trajectory" else {}
    metrics = _train(copy.deepcopy(hf_model), tokenizer, trajectories, advantage=mode, micro_batch_size=4,
                     off_policy=off_policy)  # fmt: skip
    rows = sum(len(t.runs) for t in trajectories)  # = turns: one row per turn in either mode
    assert metrics["valid_rows"] == rows and metrics["valid_trajectories"] == 2
    assert metrics["tokens_sampled"] == metrics["tokens_trained"] == generated and metrics["tokens_excluded"] == 0
    assert metrics["logprob_diff"] < 1e-3  # the trainer scores every turn on the prompt the engine saw
    assert metrics["grad_norm"] > 0
    assert metrics["is_masked_fraction"] == 0.0 and abs(metrics["is_weight_mean"] - 1) < 1e-3  # on-policy: none left out
