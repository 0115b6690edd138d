"""Weight sync into a running in-process vLLM engine, checked by logprob parity with the training model."""

from __future__ import annotations

import anyio
import torch

from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.parity import logprob_parity
from agentic_rl.types import Trajectory


def _prompt(tokenizer, text):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
    return tokenizer.encode(rendered, add_special_tokens=False)


async def _sample_batch(engine, tokenizer, n=4):
    prompts = [_prompt(tokenizer, f"Write a sentence about the number {i}.") for i in range(n)]
    trajs = []
    for i, prompt in enumerate(prompts):
        g = await engine.generate(prompt, {"max_tokens": 24, "min_tokens": 24, "temperature": 1.0, "seed": i})
        trajs.append(Trajectory(prompt_tokens=prompt, response_tokens=g.token_ids, response_masks=[1] * 24,
                                response_logprobs=g.logprobs, idx=i))  # fmt: skip
    return pack_trajectories(trajs, pad_token_id=tokenizer.pad_token_id)


async def test_synced_weights_reach_the_engine_with_fp32_logprob_parity(fp32_engine, hf_model, tokenizer):
    original = {n: p.detach().clone() for n, p in hf_model.named_parameters()}
    before = logprob_parity(hf_model, await _sample_batch(fp32_engine, tokenizer))
    assert before["mean_abs_diff"] < 1e-3, before  # same weights, same dtype: packing and masks line up

    prompt = _prompt(tokenizer, "Name three fruits.")
    greedy = {"max_tokens": 16, "min_tokens": 16, "temperature": 0.0}
    tokens_before = (await fp32_engine.generate(prompt, greedy)).token_ids
    version = fp32_engine.weight_version
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if "mlp.down_proj" in name or name.endswith("embed_tokens.weight"):
                p.mul_(1.25)
    try:
        seconds = await fp32_engine.update_weights(hf_model.named_parameters())
        assert seconds > 0 and fp32_engine.weight_version == version + 1
        after = logprob_parity(hf_model, await _sample_batch(fp32_engine, tokenizer))
        assert after["mean_abs_diff"] < 1e-3, after  # includes the tied lm_head (scaled embedding)
        assert (await fp32_engine.generate(prompt, greedy)).token_ids != tokens_before
    finally:
        with torch.no_grad():
            for name, p in hf_model.named_parameters():
                p.copy_(original[name])
        await fp32_engine.update_weights(hf_model.named_parameters())
    assert (await fp32_engine.generate(prompt, greedy)).token_ids == tokens_before


async def test_requests_in_flight_during_a_sync_complete_and_are_not_aborted(fp32_engine, hf_model, tokenizer):
    prompt = _prompt(tokenizer, "Count slowly.")
    results = []

    async def one(i):
        results.append(await fp32_engine.generate(prompt, {"max_tokens": 48, "min_tokens": 48, "seed": i}))

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
        await anyio.sleep(0.5)
        await fp32_engine.update_weights(hf_model.named_parameters())
    assert len(results) == 8
    assert all(len(r.token_ids) == 48 and r.finish_reason == "length" for r in results)


async def test_sleep_and_wake_are_skipped_on_the_cpu_with_a_log_line(fp32_engine, model_dir, caplog):
    import logging

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    wants_sleep = VLLMEngine(VLLMEngineConfig(model=model_dir, enable_sleep_mode=True))
    with caplog.at_level(logging.INFO, logger="agentic_rl.engine.vllm_engine"):
        assert await wants_sleep.sleep() is False
        assert await wants_sleep.wake_up(["weights"]) is False
    assert "not supported on the CPU" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agentic_rl.engine.vllm_engine"):
        assert await fp32_engine.sleep() is False
    assert "enable_sleep_mode is off" in caplog.text
    out = await fp32_engine.generate([1, 2, 3], {"max_tokens": 2, "min_tokens": 2})
    assert len(out.token_ids) == 2  # still serving
