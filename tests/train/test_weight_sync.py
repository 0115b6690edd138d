"""Weight sync into a running in-process vLLM engine, checked by logprob parity with the training model."""

from __future__ import annotations

import anyio
import pytest
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


@pytest.mark.parametrize("weight_sync", ["in_place", "reload"])
async def test_synced_weights_reach_the_engine_with_fp32_logprob_parity(fp32_engine, hf_model, tokenizer, weight_sync):
    fp32_engine.config.weight_sync = weight_sync
    try:
        await _check_fp32_logprob_parity(fp32_engine, hf_model, tokenizer)
    finally:
        fp32_engine.config.weight_sync = "in_place"
    path = "in-place copy" if weight_sync == "in_place" else "vLLM reload_weights"
    assert fp32_engine.last_weight_sync.startswith(path), fp32_engine.last_weight_sync


async def _check_fp32_logprob_parity(fp32_engine, hf_model, tokenizer):
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


# ------------------------------------------------------------------------------ no KV of old weights after a sync


async def _wait_for(predicate) -> None:
    with anyio.fail_after(300):  # a guard against hanging, not a speed target
        while not await predicate():
            await anyio.sleep(0.01)


def _long_prompt(tokenizer) -> list[int]:
    words = " ".join(f"item{i} is {i * 7 % 13} apples;" for i in range(52))
    prompt = _prompt(tokenizer, f"Here is an inventory: {words} How many apples in total?")
    assert 400 < len(prompt) < 600
    return prompt


async def _engine_vs_model(engine, model, tokenizer, prompt) -> float:
    """Mean |engine - model| logprob (nats) of 8 greedy tokens after `prompt`."""
    g = await engine.generate(prompt, {"max_tokens": 8, "min_tokens": 8, "temperature": 0.0})
    traj = Trajectory(prompt_tokens=prompt, response_tokens=g.token_ids, response_masks=[1] * 8,
                      response_logprobs=g.logprobs)  # fmt: skip
    return logprob_parity(model, pack_trajectories([traj], pad_token_id=tokenizer.pad_token_id))["mean_abs_diff"]


class _Perturbed:
    """Scales some training-model weights (the tied embedding included); restores model and engine on exit."""

    def __init__(self, model, engine) -> None:
        self.model, self.engine = model, engine
        self.original = {n: p.detach().clone() for n, p in model.named_parameters()}

    async def __aenter__(self):
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if "mlp.down_proj" in name or name.endswith("embed_tokens.weight"):
                    p.mul_(1.25)
        return self

    async def __aexit__(self, *exc_info):
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(self.original[name])
        await self.engine.update_weights(self.model.named_parameters())


def _scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


async def _sync_with_a_long_request_in_flight(engine, model, tokenizer, after_sync=None) -> dict:
    """Cache a prompt, start a long request, sync perturbed weights while it runs, re-run the prompt.

    Returns `gap` (mean |engine - model| logprob of the re-run, nats), `order` (which finished first),
    `preemptions` (of the long request, read right after the sync) and `long` (its generation).
    """
    prompt = _long_prompt(tokenizer)
    assert await _engine_vs_model(engine, model, tokenizer, prompt) < 1e-3  # `prompt` is now in the prefix cache
    long_prompt = _prompt(tokenizer, "Tell a long story.")
    out: dict = {"order": []}

    async def long_request():
        out["long"] = await engine.generate(long_prompt, {"max_tokens": 300, "min_tokens": 300, "seed": 5})
        out["order"].append("long")

    async with _Perturbed(model, engine):
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_request)
            await _wait_for(lambda: engine.call(lambda llm: len(_scheduler(llm).running) == 1))  # holds KV blocks
            await engine.update_weights(model.named_parameters())
            out["preemptions"] = await engine.call(
                lambda llm: [r.num_preemptions for r in _scheduler(llm).requests.values()]
            )
            assert engine.in_flight_requests == 1  # still there after the sync returned: it was in flight during it
            if after_sync is not None:
                await after_sync()
            out["gap"] = await _engine_vs_model(engine, model, tokenizer, prompt)
            out["order"].append("rerun")
    assert len(out["long"].token_ids) == 300 and out["long"].finish_reason == "length"
    return out


async def test_a_sync_with_a_request_in_flight_leaves_no_cached_kv_of_the_old_weights(fp32_engine, hf_model, tokenizer):
    out = await _sync_with_a_long_request_in_flight(fp32_engine, hf_model, tokenizer)
    assert out["gap"] < 1e-3, out["gap"]  # a stale cached prefix gave ~0.8 nats here
    assert out["preemptions"] == [1]  # the in-flight request's KV is recomputed with the new weights


async def test_without_preemption_on_reset_new_requests_wait_for_the_reset(fp32_engine, hf_model, tokenizer):
    """A vLLM whose reset cannot preempt: new requests wait until the long request ends and the reset succeeds."""

    def plain_reset_only(llm):
        original = llm.reset_prefix_cache
        llm.reset_prefix_cache = lambda: original()  # the signature of vLLM versions without preemption on reset

    async def cancel_a_held_request():
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(fp32_engine.generate, [1, 2, 3], {"max_tokens": 2})
                await _wait_for(lambda: _true(fp32_engine.in_flight_requests == 2))
                scope.cancel()
        await _wait_for(lambda: _true(fp32_engine.in_flight_requests == 1))  # dropped from the held requests

    await fp32_engine.call(plain_reset_only)
    try:
        out = await _sync_with_a_long_request_in_flight(fp32_engine, hf_model, tokenizer, cancel_a_held_request)
    finally:
        await fp32_engine.call(lambda llm: llm.__dict__.pop("reset_prefix_cache"))
    assert out["gap"] < 1e-3, out["gap"]
    assert out["preemptions"] == [0] and out["order"] == ["long", "rerun"]
    assert fp32_engine.in_flight_requests == 0


async def _true(value: bool) -> bool:
    return value


async def test_a_reset_that_keeps_failing_fails_held_requests_until_it_succeeds(fp32_engine, hf_model):
    from agentic_rl.errors import EngineError

    def failing_reset(llm):
        llm.reset_prefix_cache = lambda *args, **kwargs: False

    await fp32_engine.call(failing_reset)
    try:
        await fp32_engine.update_weights(hf_model.named_parameters())
        with pytest.raises(EngineError, match="prefix cache could not be reset after a weight update"):
            await fp32_engine.generate([1, 2, 3], {"max_tokens": 2})
        assert fp32_engine.in_flight_requests == 0
    finally:
        await fp32_engine.call(lambda llm: llm.__dict__.pop("reset_prefix_cache"))
    out = await fp32_engine.generate([1, 2, 3], {"max_tokens": 2, "min_tokens": 2})  # the next reset succeeds
    assert len(out.token_ids) == 2
