"""The engine's processed logprobs and the trainer's logprobs under the same `SamplingDistribution` agree: the
importance ratio of tokens sampled with top-p / top-k / temperature is 1 on average, with the same fp32 weights."""

from __future__ import annotations

import copy

import anyio
import pytest
import torch

from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from agentic_rl.train.logprobs import SamplingDistribution
from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer
from agentic_rl.types import Trajectory

PROMPTS = 8
MAX_TOKENS = 64

# Measured here (SmolLM2-135M-Instruct, fp32 on both sides, 8 prompts x 64 tokens, vLLM 0.32 CPU), the mean of
# exp(trainer - engine) over ~510 response tokens:
#   sampling                          with the distribution   raw trainer / processed engine   raw trainer / raw engine
#   top_p=0.8                         1.00000 (max 4e-5 nats)  0.848                            0.99999
#   temperature=0.7, top_k=20         1.00000 (max 5e-5 nats)  0.862                            0.99999
#   temperature=0.7, top_k=20, p=0.8  1.00000 (max 5e-5 nats)  0.704                            0.99999
# The middle column is the bias the distribution removes: at temperature 1 with top-p alone, each token's ratio is
# the nucleus's raw mass, in [top_p, 1].


# Session-scoped: closing a vLLM engine in this process tears down vLLM's process-wide parallel state, which every
# engine still running (the session's shared ones) needs, so these close only when the session ends.
@pytest.fixture(scope="session")
def engines(model_dir):
    """Two fp32 engines on the same weights, one recording processed logprobs, one raw."""
    built = {}
    for mode in ("processed", "raw"):
        config = VLLMEngineConfig(model=model_dir, max_model_len=1024, kv_cache_gib=0.25, dtype="float32",
                                  logprobs_mode=mode)  # fmt: skip
        built[mode] = VLLMEngine(config)
        built[mode].start_sync()
    yield built
    for engine in built.values():
        anyio.run(engine.close)


@pytest.fixture(scope="module")
def trainer_model(model_dir):
    """A fresh fp32 copy of the weights the engines loaded (the train tests' shared model may have been changed)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def _prompt(tokenizer, text):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
    return tokenizer.encode(rendered, add_special_tokens=False)


async def _sample(engine, tokenizer, sampling):
    """A packed batch of PROMPTS requests sampled at once with `sampling` (seeded), its logprobs the engine's."""
    return pack_trajectories(await _trajectories(engine, tokenizer, sampling), pad_token_id=tokenizer.pad_token_id)


async def _trajectories(engine, tokenizer, sampling):
    """PROMPTS trajectories sampled at once with `sampling` (seeded), rewarded 0 and 1 in turn, one group."""
    prompts = [_prompt(tokenizer, f"Tell me a long story about a town with {i + 2} bridges.") for i in range(PROMPTS)]
    outputs = {}

    async def one(i):
        outputs[i] = await engine.generate(prompts[i], {**sampling, "max_tokens": MAX_TOKENS, "seed": 100 + i})

    async with anyio.create_task_group() as tg:
        for i in range(PROMPTS):
            tg.start_soon(one, i)
    trajectories = [Trajectory(prompt_tokens=prompts[i], response_tokens=outputs[i].token_ids,
                               response_masks=[1] * len(outputs[i].token_ids), response_logprobs=outputs[i].logprobs,
                               idx=i, trajectory_reward=float(i % 2)) for i in range(PROMPTS)]  # fmt: skip
    return trajectories


def _mean_ratio(model, batch, distribution):
    """Mean over response tokens of exp(trainer - engine), and the largest |trainer - engine| (nats)."""
    with torch.no_grad():
        new = response_logprobs(model, batch, distribution=distribution)
    mask = batch.response_mask.bool()
    gap = (new - batch.old_logprobs)[mask]
    return float(gap.exp().mean()), float(gap.abs().max())


SAMPLINGS = [{"top_p": 0.8}, {"temperature": 0.7, "top_k": 20}, {"temperature": 0.7, "top_k": 20, "top_p": 0.8}]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
async def test_trainer_logprobs_under_the_sampling_distribution_match_the_engines(engines, trainer_model, tokenizer,
                                                                                   sampling):  # fmt: skip
    distribution = SamplingDistribution.of(sampling)
    processed = await _sample(engines["processed"], tokenizer, sampling)
    raw = await _sample(engines["raw"], tokenizer, sampling)
    tokens = int(processed.response_mask.sum())
    assert tokens >= 200, f"only {tokens} tokens sampled"
    with_it, worst = _mean_ratio(trainer_model, processed, distribution)
    without, _ = _mean_ratio(trainer_model, processed, None)
    raw_raw, _ = _mean_ratio(trainer_model, raw, None)
    report = (f"{sampling}: {tokens} tokens; mean exp(trainer - engine): with the distribution {with_it:.5f} (max "
              f"|gap| {worst:.2e} nats), raw trainer / processed engine {without:.5f}, raw trainer / raw engine "
              f"{raw_raw:.5f}")  # fmt: skip
    print(report)
    assert abs(with_it - 1.0) < 0.01, report
    if distribution.temperature == 1.0 and distribution.top_k <= 0:  # the engine renormalized over a nucleus of raw
        with torch.no_grad():  # mass Z in [top_p, 1]: its logprob is the raw one minus log Z
            kept_mass = (response_logprobs(trainer_model, processed) - processed.old_logprobs).exp()
        kept_mass = kept_mass[processed.response_mask.bool()]
        assert kept_mass.min() > distribution.top_p - 1e-3 and kept_mass.max() < 1 + 1e-3, report


@pytest.mark.slow
async def test_the_trainer_computes_the_policy_and_the_reference_under_its_sampling(engines, trainer_model, tokenizer):
    sampling = {"temperature": 0.7, "top_k": 20, "top_p": 0.8}
    trajectories = await _trajectories(engines["processed"], tokenizer, sampling)
    metrics = {}
    for name, distribution in (("with", SamplingDistribution.of(sampling)), ("without", None)):
        trainer = GRPOTrainer(copy.deepcopy(trainer_model), pad_token_id=tokenizer.pad_token_id,
                              config=GRPOConfig(kl_coef=0.1), sampling=distribution)  # fmt: skip
        metrics[name] = trainer.train_step(trajectories, group_ids=[0] * PROMPTS).as_metrics()
    report = {name: {key: m[key] for key in ("logprob_diff", "kl", "clip_fraction")} for name, m in metrics.items()}
    print(report)
    # Before the update the policy is the reference, so the KL is 0 only if both see the same distribution; and
    # the policy's logprobs are the engine's. Measured: with the sampling, logprob_diff 4e-6 nats and no token
    # clipped; without it, 0.40 nats and a third of the tokens (0.34) clipped before any update.
    assert metrics["with"]["logprob_diff"] < 1e-3, report
    assert metrics["with"]["kl"] < 1e-6 and metrics["with"]["clip_fraction"] == 0.0, report
