"""One GRPO step on the real SmolLM2 model, with trajectories sampled by the fp32 engine."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.types import RunRecorder, Step, StepTrajectory, TokenRun


async def _group(engine, tokenizer, rewards, task_id="t0"):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Say a number."}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
    prompt = tokenizer.encode(rendered, add_special_tokens=False)
    out = []
    for i, reward in enumerate(rewards):
        g = await engine.generate(prompt, {"max_tokens": 12, "min_tokens": 12, "temperature": 1.0, "seed": 100 + i})
        out.append(StepTrajectory(prompt_tokens=prompt, response_tokens=g.token_ids, response_masks=[1] * 12,
                                  response_logprobs=g.logprobs, trajectory_reward=reward, idx=i,
                                  task={"id": task_id}))  # fmt: skip
    return out


@pytest.fixture
def model_copy(hf_model):
    return copy.deepcopy(hf_model)


async def test_train_step_updates_weights_and_reports_metrics(fp32_engine, tokenizer, model_copy):
    trajs = await _group(fp32_engine, tokenizer, [1.0, 0.0, 1.0, 0.0])
    before = {n: p.detach().clone() for n, p in model_copy.named_parameters()}
    trainer = GRPOTrainer(model_copy, pad_token_id=tokenizer.pad_token_id,
                          config=GRPOConfig(lr=1e-4, micro_batch_size=2))  # fmt: skip
    metrics = trainer.train_step(trajs).as_metrics()

    assert metrics["valid_rows"] == 4 and metrics["tokens"] == 48
    assert metrics["reward_mean"] == pytest.approx(0.5) and metrics["reward_std"] == pytest.approx(0.5)
    assert metrics["logprob_diff"] < 1e-3  # fp32 engine vs fp32 trainer on the same weights
    assert metrics["grad_norm"] > 0 and torch.isfinite(torch.tensor(metrics["loss"]))
    assert abs(metrics["loss"]) < 1e-4  # on-policy: ratio 1, advantages sum to 0 within the group
    changed = sum(not torch.equal(before[n], p) for n, p in model_copy.named_parameters())
    assert changed > 0


async def test_group_without_reward_signal_leaves_weights_unchanged(fp32_engine, tokenizer, model_copy):
    trajs = await _group(fp32_engine, tokenizer, [1.0, 1.0, 1.0])
    before = {n: p.detach().clone() for n, p in model_copy.named_parameters()}
    trainer = GRPOTrainer(model_copy, pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(lr=1e-3))
    metrics = trainer.train_step(trajs).as_metrics()
    assert metrics["grad_norm"] == 0.0
    assert all(torch.equal(before[n], p) for n, p in model_copy.named_parameters())


async def test_failed_trajectories_do_not_enter_the_loss(fp32_engine, tokenizer, model_copy):
    trajs = await _group(fp32_engine, tokenizer, [1.0, 0.0, 1.0])
    trajs[2].failed = True
    trainer = GRPOTrainer(model_copy, pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(lr=1e-4))
    metrics = trainer.train_step(trajs).as_metrics()
    assert metrics["valid_rows"] == 2 and metrics["tokens"] == 24


async def test_kl_to_the_initial_model_is_zero_before_any_update(fp32_engine, tokenizer, model_copy):
    trajs = await _group(fp32_engine, tokenizer, [1.0, 0.0])
    trainer = GRPOTrainer(model_copy, pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(lr=1e-4, kl_coef=0.1))
    first = trainer.train_step(trajs).as_metrics()
    second = trainer.train_step(trajs).as_metrics()
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl"] > 0


async def test_tracked_kl_is_measured_and_never_enters_the_loss(fp32_engine, tokenizer, hf_model):
    trajs = await _group(fp32_engine, tokenizer, [1.0, 0.0])
    tracked, plain = copy.deepcopy(hf_model), copy.deepcopy(hf_model)
    trainers = [GRPOTrainer(model, pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(lr=1e-4, track_kl=track))
                for model, track in ((tracked, True), (plain, False))]  # fmt: skip
    steps = [[trainer.train_step(trajs).as_metrics() for _ in range(2)] for trainer in trainers]
    assert steps[0][0]["kl"] == pytest.approx(0.0, abs=1e-6) and steps[0][1]["kl"] > 0  # moved from the start
    assert steps[1][1]["kl"] == 0.0  # not measured without a reference
    for with_kl, without in zip(steps[0], steps[1], strict=True):
        assert with_kl["loss"] == with_kl["pg_loss"] == without["loss"]  # kl_coef 0: the KL is only reported
    assert all(torch.equal(a, b) for a, b in zip(tracked.parameters(), plain.parameters(), strict=True))


async def _rewritten(engine, tokenizer, reward: float, i: int) -> StepTrajectory:
    """Three turns sampled by the fp32 engine in two runs: memory replaced the history with a summary before turn 2."""

    def chat(text: str) -> list[int]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
        return tokenizer.encode(rendered, add_special_tokens=False)

    glue = tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnother one.<|im_end|>\n<|im_start|>assistant\n",
                            add_special_tokens=False)  # fmt: skip
    sampling = {"max_tokens": 8, "min_tokens": 8, "temperature": 1.0}
    p0 = chat("Say a number.")
    g0 = await engine.generate(p0, {**sampling, "seed": 300 + 3 * i})
    p1 = p0 + g0.token_ids + glue
    g1 = await engine.generate(p1, {**sampling, "seed": 301 + 3 * i})
    p2 = chat("Summary: the user asked for two numbers. Say one more.")
    g2 = await engine.generate(p2, {**sampling, "seed": 302 + 3 * i})
    recorder, steps = RunRecorder(), []
    for p, g in ((p0, g0), (p1, g1), (p2, g2)):
        if recorder.runs and recorder.current.extends(p):
            recorder.extend_to(p)
        else:
            recorder.start(p)
        run, span = recorder.sample(g.token_ids, g.logprobs, 0)
        steps.append(Step(run=run, span=span))
    return StepTrajectory.from_runs(recorder.runs, trajectory_reward=reward, idx=i, task={"id": "t0"}, steps=steps)


async def test_every_run_of_a_rewritten_history_is_trained_in_its_own_context(fp32_engine, tokenizer, model_copy):
    trajs = [await _rewritten(fp32_engine, tokenizer, r, i) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])]
    trainer = GRPOTrainer(model_copy, pad_token_id=tokenizer.pad_token_id,
                          config=GRPOConfig(lr=1e-4, micro_batch_size=3))  # fmt: skip
    metrics = trainer.train_step(trajs).as_metrics()

    # all 3 turns x 8 tokens of each trajectory, not only its last run's 8
    assert metrics["tokens_sampled"] == metrics["tokens_trained"] == metrics["tokens"] == 96
    assert metrics["tokens_excluded"] == 0 and metrics["valid_rows"] == 8 and metrics["valid_trajectories"] == 4
    assert metrics["response_length"] == 24.0
    # The trainer's logprobs match the engine's on every token: each run sits on the prompt it was sampled from.
    assert metrics["logprob_diff"] < 1e-3
    assert abs(metrics["loss"]) < 1e-4  # on-policy, and each trajectory's runs share one advantage
    assert metrics["grad_norm"] > 0


async def test_engine_logprobs_far_below_the_trainers_are_truncated_and_the_step_stays_finite(fp32_engine, tokenizer,
                                                                                             model_copy):  # fmt: skip
    """Every other engine logprob lowered by 1 nat: those tokens' weight pi_prox / pi_behav is about e > 2 (cap 2)."""
    sampled = await _group(fp32_engine, tokenizer, [1.0, 0.0, 1.0, 0.0])
    trajs = []
    for t in sampled:
        logprobs = [lp - 1.0 if j % 2 == 0 else lp for j, lp in enumerate(t.response_logprobs.tolist())]
        run = TokenRun(t.prompt_tokens.tolist(), t.response_tokens.tolist(), [1] * 12, logprobs, [0] * 12)
        trajs.append(StepTrajectory.from_runs([run], trajectory_reward=t.trajectory_reward, idx=t.idx, task=t.task))
    trainer = GRPOTrainer(model_copy, pad_token_id=tokenizer.pad_token_id,
                          config=GRPOConfig(lr=1e-4, micro_batch_size=3))  # default: `tis`, cap 2  # fmt: skip
    metrics = trainer.train_step(trajs, weight_version=1).as_metrics()

    assert metrics["is_truncated_fraction"] == pytest.approx(0.5) and metrics["is_masked_fraction"] == 0.0
    assert metrics["is_weight_max"] == pytest.approx(math.e, rel=1e-2)  # fp32 engine and trainer agree to 1e-3
    assert metrics["is_weight_mean"] == pytest.approx((math.e + 1) / 2, rel=1e-2)
    assert metrics["lag_tokens"] == {1: 48} and metrics["tokens_trained"] == 48
    assert metrics["lag_logprob_gap"][1] == pytest.approx(0.5, abs=1e-3) == metrics["logprob_diff"]
    assert math.isfinite(metrics["loss"]) and 0 < metrics["grad_norm"] < math.inf and metrics["step_skipped"] == 0
