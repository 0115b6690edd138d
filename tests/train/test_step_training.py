"""Step-level advantages (`GRPOConfig.advantage = "step"`) in `GRPOTrainer.train_step`, on the real SmolLM2 model with
trajectories sampled by the fp32 engine: equal to trajectory mode where the math says so, one row per step otherwise."""

from __future__ import annotations

import copy

import pytest
import torch
from support.engines import ForcedCallEngine
from test_trainer import _rewritten

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.harness import HarnessConfig
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.train.turn_rows import step_units
from agentic_rl.types import RunRecorder, Step, StepTrajectory


async def _one_turn(engine, tokenizer, rewards: list[float], task_id: str, seed: int) -> list[StepTrajectory]:
    """One sampled turn per trajectory (12 tokens), its `Step` rewarded with the trajectory's reward."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": f"Say a number ({task_id})."}],
                                             add_generation_prompt=True, tokenize=False)  # fmt: skip
    prompt = tokenizer.encode(rendered, add_special_tokens=False)
    out = []
    for i, reward in enumerate(rewards):
        g = await engine.generate(prompt, {"max_tokens": 12, "min_tokens": 12, "temperature": 1.0, "seed": seed + i})
        recorder = RunRecorder()
        recorder.start(prompt)
        run, span = recorder.sample(g.token_ids, g.logprobs, 0)
        out.append(StepTrajectory.from_runs(recorder.runs, trajectory_reward=reward, idx=i, task={"id": task_id},
                                            steps=[Step(reward=reward, run=run, span=span)]))  # fmt: skip
    return out


def _train(model, tokenizer, trajectories, **config) -> dict:
    torch.manual_seed(0)
    trainer = GRPOTrainer(model, pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(lr=1e-4, **config))
    return trainer.train_step(trajectories).as_metrics()


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "sequence-mean"])
async def test_one_turn_trajectories_train_identically_in_step_and_trajectory_mode(fp32_engine, tokenizer, hf_model,
                                                                                   loss_agg_mode):  # fmt: skip
    trajectories = (await _one_turn(fp32_engine, tokenizer, [1.0, 0.0, 0.5, 0.0], "a", 500)
                    + await _one_turn(fp32_engine, tokenizer, [0.2, 0.9, 0.2], "b", 600))  # fmt: skip
    trajectories[2].failed = True
    by_mode = {}
    for mode in ("trajectory", "step"):
        model = copy.deepcopy(hf_model)
        metrics = _train(model, tokenizer, trajectories, advantage=mode, micro_batch_size=2, loss_agg_mode=loss_agg_mode)
        by_mode[mode] = (metrics, dict(model.named_parameters()))
    (traj, traj_weights), (step, step_weights) = by_mode["trajectory"], by_mode["step"]
    assert traj["grad_norm"] > 0 and traj["valid_rows"] == 6
    for key in ("loss", "pg_loss", "grad_norm", "reward_mean", "reward_std", "valid_trajectories", "valid_rows",
                "zero_advantage_rows", "response_length", "tokens_sampled", "tokens_trained", "tokens_excluded"):  # fmt: skip
        assert step[key] == traj[key], key
    assert all(torch.equal(traj_weights[name], p) for name, p in step_weights.items())


async def _two_turn_rollout(engine, tokenizer) -> tuple[list[StepTrajectory], ForcedCallEngine]:
    """Six samples of one task (and two of another): turn 0 calls the calculator (constrained), turn 1 is free."""
    forced = ForcedCallEngine(engine, tokenizer, forced_turns=1)
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=512,
                           sampling={"temperature": 1.0, "max_tokens": 48, "seed": 11})  # fmt: skip
    spec = RolloutSpec(forced, env, renderer, config, reward_fn=gsm8k_reward)
    tasks = [{"id": "mul", "question": "What is 12 * 7? Use the calculator.", "ground_truth": "84"}] * 6
    tasks += [{"id": "add", "question": "What is 30 + 12? Use the calculator.", "ground_truth": "42"}] * 2
    trajectories = list((await Rollout(spec, n_parallel_agents=8).run(tasks)).trajectories)
    return trajectories, forced


async def test_two_turn_trajectories_train_one_row_per_step_with_exact_accounting(fp32_engine, tokenizer, hf_model):
    trajectories, forced = await _two_turn_rollout(fp32_engine, tokenizer)
    trajectories[1].failed = True  # excluded whole, its tokens counted as excluded
    valid = [t for t in trajectories if not t.failed]
    assert len(valid) >= 6 and any(len(t.steps) == 2 for t in valid)
    sampled: dict[tuple[int, ...], list] = {}  # the samples of one task share their first prompt
    for prompt, _, generation in forced.calls:
        sampled.setdefault(tuple(prompt), []).append(generation)
    units = step_units(trajectories, gamma=0.9)
    batch = pack_trajectories(units.units, pad_token_id=tokenizer.pad_token_id, group_ids=units.group_ids)
    rows = 0
    for row, (owner, turn) in enumerate(zip(units.owners, units.turns, strict=True)):
        t = trajectories[owner]
        if t.failed:
            continue
        step = t.steps[turn]  # the engine sampled this step's ids from exactly this row's prompt
        n = len(step.response_ids)
        rows += n > 0  # a turn that sampled only its stop token has no row to train
        matches = [g for g in sampled[tuple(step.prompt_ids)] if g.token_ids[:n] == step.response_ids]
        assert matches  # identical samples of one prompt have identical logprobs too
        generation = matches[0]
        mask = batch.response_mask[row].bool()
        assert batch.responses[row][mask].tolist() == step.response_ids and int(mask.sum()) == n
        assert batch.old_logprobs[row][mask].tolist() == pytest.approx(generation.logprobs[:n])
        assert batch.input_ids[row][batch.attention_mask[row].bool()].tolist() == step.prompt_ids + step.response_ids
    assert rows >= len(valid) and len(units.units) == sum(len(t.steps) for t in valid) + 1  # + the failed one

    metrics = _train(copy.deepcopy(hf_model), tokenizer, trajectories, advantage="step", gamma=0.9, micro_batch_size=3)
    assert metrics["valid_rows"] == rows and metrics["valid_trajectories"] == len(valid)
    assert metrics["tokens_sampled"] == sum(t.num_generated_tokens for t in trajectories)
    assert metrics["tokens_sampled"] == metrics["tokens_trained"] + metrics["tokens_excluded"]
    assert metrics["tokens_excluded_failed"] == trajectories[1].num_generated_tokens
    assert metrics["tokens_trained"] == sum(t.num_generated_tokens for t in valid) == metrics["tokens"]
    assert metrics["reward_mean"] == pytest.approx(sum(t.trajectory_reward for t in valid) / len(valid), abs=1e-6)


async def test_each_run_of_a_rewritten_history_trains_its_steps_in_their_own_contexts(fp32_engine, tokenizer,
                                                                                      hf_model):  # fmt: skip
    trajectories = [await _rewritten(fp32_engine, tokenizer, r, i) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])]
    for t in trajectories:  # the answer's reward on the last turn, and a reward for turn 0 that differs by sample
        t.steps[-1].reward = t.trajectory_reward
        t.steps[0].reward = 0.1 * t.idx
    metrics = _train(copy.deepcopy(hf_model), tokenizer, trajectories, advantage="step", micro_batch_size=5)
    assert metrics["valid_rows"] == 12 and metrics["valid_trajectories"] == 4  # 3 steps (in two runs) each
    assert metrics["tokens_sampled"] == metrics["tokens_trained"] == 96 and metrics["tokens_excluded"] == 0
    assert metrics["response_length"] == 24.0
    assert metrics["logprob_diff"] < 1e-3  # every step row sits on the exact prompt the engine sampled it from
    assert abs(metrics["loss"]) < 1e-4  # on-policy, and each turn index's advantages sum to 0 within the group
    assert metrics["grad_norm"] > 0
