"""The in-process vLLM engine: token-in/token-out, concurrency, bad requests, cancellation, engine calls."""

from __future__ import annotations

import os
import threading

import anyio
import pytest

from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from agentic_rl.errors import ConfigError, EngineError


def _prompt(tokenizer, text="Count from one to five."):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


def test_engine_runs_in_this_process_on_its_own_thread(engine):
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    names = [t.name for t in threading.enumerate()]
    assert "agentic-rl-engine" in names
    assert engine.max_model_len == 2048


async def test_generate_returns_sampled_ids_logprobs_and_finish_reason(engine, tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = await engine.generate(_prompt(tokenizer), {"max_tokens": 64, "temperature": 0.0, "stop_token_ids": [eos]})
    assert len(out.logprobs) == len(out.token_ids) > 0
    assert all(lp <= 0.0 for lp in out.logprobs)
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == eos
    else:
        assert out.finish_reason == "length" and len(out.token_ids) == 64


async def test_greedy_generation_is_reproducible_and_max_tokens_is_respected(engine, tokenizer):
    prompt = _prompt(tokenizer)
    a = await engine.generate(prompt, {"max_tokens": 12, "min_tokens": 12, "temperature": 0.0})
    b = await engine.generate(prompt, {"max_tokens": 12, "min_tokens": 12, "temperature": 0.0})
    assert a.token_ids == b.token_ids
    assert len(a.token_ids) == 12 and a.finish_reason == "length"
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


async def test_concurrent_requests_all_complete_with_their_own_seeds(engine, tokenizer):
    prompt = _prompt(tokenizer, "Write one word.")
    results = {}

    async def one(i):
        results[i] = await engine.generate(prompt, {"max_tokens": 16, "min_tokens": 16, "temperature": 1.0, "seed": i})

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(one, i)
    assert sorted(results) == list(range(16))
    assert all(len(r.token_ids) == 16 for r in results.values())
    assert len({tuple(r.token_ids) for r in results.values()}) > 1  # different seeds, different samples


async def test_seeded_prompts_larger_than_one_step_budget_complete(engine, tokenizer):
    # 24 distinct ~300-token prompts (~7k tokens) exceed one engine step's token budget: with chunked prefill a
    # seeded prompt split across steps crashed the CPU engine ("CPU Generator does not use offset").
    prompts = [_prompt(tokenizer, f"Case {i}: " + " ".join(f"item{i}-{j}" for j in range(60))) for i in range(24)]
    assert sum(map(len, prompts)) > 4096
    results = {}

    async def one(i):
        results[i] = await engine.generate(prompts[i], {"max_tokens": 4, "min_tokens": 4, "temperature": 1.0, "seed": i})

    async with anyio.create_task_group() as tg:
        for i in range(24):
            tg.start_soon(one, i)
    assert sorted(results) == list(range(24)) and all(len(r.token_ids) == 4 for r in results.values())


async def test_bad_request_fails_alone_while_siblings_complete(engine, tokenizer):
    prompt = _prompt(tokenizer)
    outcomes = {}

    async def good(i):
        outcomes[i] = await engine.generate(prompt, {"max_tokens": 8})

    async def bad(kind, sampling, ids, error=EngineError, match="rejected"):
        with pytest.raises(error, match=match):
            await engine.generate(ids, sampling)
        outcomes[kind] = "raised"

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(good, i)
        tg.start_soon(bad, "too_long", {"max_tokens": 8}, [5] * 3000)
        tg.start_soon(bad, "bad_param", {"max_tokens": 8, "temperature": -1.0}, prompt, ConfigError, "temperature")
        tg.start_soon(bad, "unknown_param", {"max_token": 8}, prompt, ConfigError, "max_token is not a known field")
        tg.start_soon(bad, "bad_token", {"max_tokens": 8}, [10**7])
    assert outcomes["too_long"] == outcomes["bad_param"] == outcomes["unknown_param"] == outcomes["bad_token"] == "raised"
    assert all(len(outcomes[i].token_ids) > 0 for i in range(4))


async def test_cancelled_request_is_aborted_and_engine_keeps_serving(engine, tokenizer):
    prompt = _prompt(tokenizer)
    with anyio.move_on_after(0.3):
        await engine.generate(prompt, {"max_tokens": 1000, "min_tokens": 1000})
    unfinished = await engine.call(lambda llm: llm.llm_engine.get_num_unfinished_requests())
    assert unfinished == 0
    out = await engine.generate(prompt, {"max_tokens": 4, "min_tokens": 4})
    assert len(out.token_ids) == 4


async def test_engine_call_runs_between_steps_and_wraps_errors(engine):
    name = await engine.call(lambda llm: type(llm).__name__)
    assert name == "LLM"

    def boom(llm):
        raise RuntimeError("nope")

    with pytest.raises(EngineError, match="nope"):
        await engine.call(boom)


async def test_a_turn_continuation_recomputes_less_than_one_kv_block(engine, tokenizer):
    # A continuation re-sends the history (prompt + sampled tokens) plus the observation. The prefix cache holds whole
    # blocks only: the history's last, partial block is prefilled again. On the CPU that block is 32 tokens (vLLM's
    # own CPU default, 128, recomputed ~80 tokens per turn).
    from vllm import SamplingParams

    from ascend.device import current_platform

    block = await engine.call(lambda llm: llm.llm_engine.vllm_config.cache_config.block_size)
    if not current_platform().is_accelerator:
        assert block == 32
    await engine.call(lambda llm: llm.reset_prefix_cache())
    first = _prompt(tokenizer, "List the planets of the solar system, one per line, with one fact about each.")
    turn = await engine.generate(first, {"max_tokens": 70, "min_tokens": 70, "temperature": 0.0})
    history = first + turn.token_ids
    continuation = history + tokenizer.encode("<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n", add_special_tokens=False)

    def cached_tokens(llm):
        (out,) = llm.generate([{"prompt_token_ids": continuation}], SamplingParams(max_tokens=1), use_tqdm=False)
        return out.num_cached_tokens

    cached = await engine.call(cached_tokens)
    # The last sampled token was never fed back, so its KV (and its block, if that is the last one) is not cached.
    assert cached % block == 0 and len(history) - 1 - block < cached <= len(history) - 1

async def test_engine_used_before_start_or_after_close_raises(model_dir):
    eng = VLLMEngine(VLLMEngineConfig(model=model_dir))
    with pytest.raises(EngineError, match="not started"):
        await eng.generate([1, 2], {"max_tokens": 1})
    await eng.close()  # closing an engine that never started is a no-op


async def test_engine_start_failure_is_an_engine_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    eng = VLLMEngine(VLLMEngineConfig(model=tmp_path))
    with pytest.raises(EngineError, match="failed to start"):
        await eng.start()


@pytest.mark.parametrize(
    ("field", "value"), [("max_model_len", 4), ("kv_cache_gib", 0.0), ("gpu_memory_utilization", 1.5)]
)
def test_engine_config_rejects_out_of_range_values(field, value):
    with pytest.raises(ConfigError, match=field):
        VLLMEngineConfig(model="x", **{field: value})
