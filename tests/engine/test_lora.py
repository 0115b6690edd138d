"""LoRA adapters on the real engine (SmolLM2, fp32): adapter-only weight sync, versions pinned per request.

The adapters are built here with peft on the Hugging Face model (seeded random A and B, so each changes the
outputs) and saved with `save_pretrained`. Parity: the engine's logprobs of its sampled tokens agree with the peft
model's teacher-forced logprobs under the same adapter. Every assertion holds for any sampled outcome and any
thread timing: the order of events comes from the engine thread's inbox, streamed tokens and paused generation.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from agentic_rl.engine.adapters import check_adapter_folder
from agentic_rl.engine.base import Generation
from agentic_rl.engine.vllm_config import llm_kwargs as _llm_kwargs
from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from agentic_rl.errors import ConfigError, EngineError
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.parity import logprob_parity
from agentic_rl.types import Trajectory

RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOLERANCE = 1e-3  # mean |engine - model| logprob (nats), as for full-weight sync (tests/train/test_weight_sync.py)
LONG = {"max_tokens": 96, "min_tokens": 96, "temperature": 1.0, "seed": 7}


# ------------------------------------------------------------------------------------------------ without an engine


@pytest.mark.parametrize(
    ("options", "key"),
    [({"max_lora_rank": 4}, "max_lora_rank"), ({"max_lora_rank": True}, "max_lora_rank"),
     ({"max_loras": 0}, "max_loras"), ({"engine_kwargs": {"enable_lora": True}}, "engine_kwargs")],
)  # fmt: skip
def test_bad_lora_options_are_refused_naming_the_key(options, key):
    with pytest.raises(ConfigError, match=f"VLLMEngineConfig.{key}"):
        VLLMEngineConfig(model="x", **options)


def test_lora_options_reach_vllm_with_one_spare_cached_adapter():
    kwargs = _llm_kwargs(VLLMEngineConfig(model="x", max_lora_rank=16, max_loras=3))
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 16
    assert kwargs["max_loras"] == 3 and kwargs["max_cpu_loras"] == 4
    assert not any("lora" in key for key in _llm_kwargs(VLLMEngineConfig(model="x")))


def _adapter_files(folder: Path, **config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, **config}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_a_folder_without_a_valid_adapter_is_refused_naming_the_problem(tmp_path):
    assert check_adapter_folder(_adapter_files(tmp_path / "ok"), 8) == (tmp_path / "ok").resolve()
    (tmp_path / "empty").mkdir()
    no_weights = _adapter_files(tmp_path / "no_weights")
    (no_weights / "adapter_model.safetensors").unlink()
    bad_json = _adapter_files(tmp_path / "bad_json")
    (bad_json / "adapter_config.json").write_text("{not json")
    cases = [
        (tmp_path / "nowhere", "does not exist"),
        (tmp_path / "empty", "holds no adapter_config.json"),
        (no_weights, "holds no weights file"),
        (bad_json, "could not be read"),
        (_adapter_files(tmp_path / "rank", r=16), "LoRA rank 16 exceeds VLLMEngineConfig.max_lora_rank=8"),
        (_adapter_files(tmp_path / "pattern", rank_pattern={"q_proj": 32}), "LoRA rank 32 exceeds"),
        (_adapter_files(tmp_path / "zero", r=0), "is not an int >= 1"),
        (_adapter_files(tmp_path / "ia3", peft_type="IA3"), "is not a LoRA adapter"),
        (_adapter_files(tmp_path / "bias", bias="all"), "without bias"),
    ]
    for folder, message in cases:
        with pytest.raises(EngineError, match=message):
            check_adapter_folder(folder, 8)


async def test_an_engine_without_lora_refuses_adapters(model_dir, tmp_path):
    engine = VLLMEngine(VLLMEngineConfig(model=model_dir))
    assert not engine.lora_enabled and await engine.loaded_adapters() == []
    with pytest.raises(EngineError, match="LoRA is off on this engine; set VLLMEngineConfig.max_lora_rank"):
        await engine.update_adapter(_adapter_files(tmp_path / "a"))


# ------------------------------------------------------------------------------------------------ the real engine


@dataclass
class Fresh:
    """The LoRA engine and what it sampled before its first adapter (base model, version 0)."""

    engine: VLLMEngine
    base: tuple[Any, list[int]]


def _prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
    return tokenizer.encode(rendered, add_special_tokens=False)


def _packed(tokenizer, samples: list[tuple[list[int], Any]]) -> Any:
    """A packed batch of `(prompt, Generation)` pairs, the engine's logprobs as the old logprobs."""
    trajs = [Trajectory(prompt_tokens=prompt, response_tokens=g.token_ids, response_masks=[1] * len(g.token_ids),
                        response_logprobs=g.logprobs, idx=i) for i, (prompt, g) in enumerate(samples)]  # fmt: skip
    return pack_trajectories(trajs, pad_token_id=tokenizer.pad_token_id)


async def _sample(engine, tokenizer) -> tuple[Any, list[int]]:
    """Four concurrent 24-token samples: `(packed batch, the weight version of every token)`."""
    samples: list[tuple[list[int], Any]] = []

    async def one(i: int) -> None:
        prompt = _prompt(tokenizer, f"Write a sentence about the number {i}.")
        sampling = {"max_tokens": 24, "min_tokens": 24, "temperature": 1.0, "seed": i}
        samples.append((prompt, await engine.generate(prompt, sampling)))

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    return _packed(tokenizer, samples), [v for _, g in samples for v in g.weight_versions]


# Session-scoped and never closed before the session ends: closing a vLLM engine in this process tears down vLLM's
# process-wide parallel state, which every other engine still running needs.
@pytest.fixture(scope="session")
def lora(model_dir, tokenizer):
    engine = VLLMEngine(VLLMEngineConfig(model=model_dir, dtype="float32", max_model_len=1024, kv_cache_gib=0.25,
                                         max_lora_rank=RANK, max_loras=2))  # fmt: skip
    engine.start_sync()
    base = anyio.run(_sample, engine, tokenizer)  # before any adapter, whichever test comes first
    yield Fresh(engine, base)
    anyio.run(engine.close)


@pytest.fixture(scope="session")
def peft_model(model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)
    return get_peft_model(base, config).eval()


def _adapter(model, seed: int) -> None:
    """Give every LoRA A and B matrix seeded random values (B non-zero, so the adapter changes the outputs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


def _save(model, folder: Path, seed: int) -> Path:
    _adapter(model, seed)
    model.save_pretrained(str(folder / f"seed{seed}"))
    return folder / f"seed{seed}"


async def _sync(engine, model, folder: Path, seed: int) -> int:
    """Save the adapter of `seed` and load it into the engine; its new weight version."""
    before = engine.weight_version
    path = _save(model, folder, seed)
    t0 = time.perf_counter()
    await engine.update_adapter(path)
    print(f"update_adapter (SmolLM2-135M, r={RANK}, {len(TARGETS)} modules): {time.perf_counter() - t0:.3f} s")
    assert engine.weight_version == before + 1
    return engine.weight_version


def _gap(model, batch, seed: int | None) -> float:
    """Mean |engine - model| logprob over `batch` under the adapter of `seed` (None: the base model)."""
    if seed is None:
        with model.disable_adapter():
            return logprob_parity(model, batch)["mean_abs_diff"]
    _adapter(model, seed)
    return logprob_parity(model, batch)["mean_abs_diff"]


async def test_engine_logprobs_match_the_peft_model_on_the_base_model_and_after_each_sync(lora, peft_model, tokenizer,
                                                                                         tmp_path):  # fmt: skip
    engine = lora.engine
    batch, versions = lora.base
    assert versions == [0] * len(versions)
    assert _gap(peft_model, batch, None) < TOLERANCE
    for seed in (1, 2, 3):
        version = await _sync(engine, peft_model, tmp_path, seed)
        batch, versions = await _sample(engine, tokenizer)
        assert versions == [version] * len(versions)
        assert _gap(peft_model, batch, seed) < TOLERANCE, seed
        assert _gap(peft_model, batch, None) > 10 * TOLERANCE  # the adapter changes the logprobs: it was applied
        assert await engine.loaded_adapters() == [version]  # nothing in flight: only the latest is held


async def test_a_request_in_flight_across_a_sync_samples_every_token_with_its_own_adapter(lora, peft_model, tokenizer,
                                                                                          tmp_path):  # fmt: skip
    engine = lora.engine
    old = await _sync(engine, peft_model, tmp_path, 11)
    prompt_a, prompt_b = _prompt(tokenizer, "Tell a long story."), _prompt(tokenizer, "Describe the sea.")
    later = {}

    async def generate_b() -> None:
        later["b"] = await engine.generate(prompt_b, LONG)

    async with contextlib.aclosing(engine.stream(prompt_a, LONG)) as stream:
        first = await stream.__anext__()  # A sampled its first tokens with the old adapter
        await engine.pause_generation()
        try:
            assert engine.in_flight_requests == 1  # A goes on after the sync
            new = await _sync(engine, peft_model, tmp_path, 12)
            assert await engine.loaded_adapters() == [old, new]  # A still uses the old one
            async with anyio.create_task_group() as tg:
                tg.start_soon(generate_b)
                with anyio.fail_after(60):
                    while engine.in_flight_requests < 2:
                        await anyio.sleep(0.005)
                await engine.resume_generation()  # A and B sample in the same batches, each with its adapter
                deltas = [first, *[d async for d in stream]]
        finally:
            await engine.resume_generation()
    a_ids = [t for d in deltas for t in d.token_ids]
    a_logprobs = [x for d in deltas for x in d.logprobs]
    a = Generation(token_ids=a_ids, logprobs=a_logprobs, finish_reason=deltas[-1].finish_reason)
    assert [v for d in deltas for v in d.weight_versions] == [old] * LONG["max_tokens"]
    assert later["b"].weight_versions == [new] * LONG["max_tokens"]
    batch_a, batch_b = _packed(tokenizer, [(prompt_a, a)]), _packed(tokenizer, [(prompt_b, later["b"])])
    assert _gap(peft_model, batch_a, 11) < TOLERANCE < _gap(peft_model, batch_a, 12) / 10
    assert _gap(peft_model, batch_b, 12) < TOLERANCE < _gap(peft_model, batch_b, 11) / 10
    assert await engine.loaded_adapters() == [new]  # the old one went when A ended


async def test_a_sync_while_generating_goes_on_does_not_change_the_adapter_of_a_request_in_flight(lora, peft_model,
                                                                                               tokenizer, tmp_path):  # fmt: skip
    engine = lora.engine
    old = await _sync(engine, peft_model, tmp_path, 41)
    prompt_a, prompt_b = _prompt(tokenizer, "Tell a long story."), _prompt(tokenizer, "Describe the sea.")
    async with contextlib.aclosing(engine.stream(prompt_a, LONG)) as stream:
        first = await stream.__anext__()  # A sampled its first tokens with the old adapter
        new = await _sync(engine, peft_model, tmp_path, 42)  # A is not paused: whatever it samples meanwhile
        b = await engine.generate(prompt_b, {**LONG, "max_tokens": 16, "min_tokens": 16})
        deltas = [first, *[d async for d in stream]]
    a = Generation(token_ids=[t for d in deltas for t in d.token_ids], logprobs=[x for d in deltas for x in d.logprobs],
                   finish_reason=deltas[-1].finish_reason)  # fmt: skip
    assert [v for d in deltas for v in d.weight_versions] == [old] * LONG["max_tokens"]
    assert b.weight_versions == [new] * 16
    assert _gap(peft_model, _packed(tokenizer, [(prompt_a, a)]), 41) < TOLERANCE
    assert _gap(peft_model, _packed(tokenizer, [(prompt_b, b)]), 42) < TOLERANCE


async def test_at_most_max_loras_adapters_are_held_and_a_sync_waits_for_a_free_one(lora, peft_model, tokenizer,
                                                                                   tmp_path):  # fmt: skip
    engine = lora.engine
    prompt = _prompt(tokenizer, "Count to twenty.")
    first = await _sync(engine, peft_model, tmp_path, 21)
    done: dict[str, Any] = {}

    async def generate(key: str) -> None:
        done[key] = await engine.generate(prompt, LONG)

    async def until_in_flight(n: int) -> None:
        with anyio.fail_after(60):
            while engine.in_flight_requests < n:
                await anyio.sleep(0.005)

    await engine.pause_generation()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(generate, "a")
            await until_in_flight(1)
            second = await _sync(engine, peft_model, tmp_path, 22)
            tg.start_soon(generate, "b")
            await until_in_flight(2)
            third = _save(peft_model, tmp_path, 23)
            full = r"all max_loras=2 adapters .* \(versions \[\d+, \d+\]\) and generation is paused"
            with pytest.raises(EngineError, match=full):
                await engine.update_adapter(third)  # both held adapters in use, and paused: none can end
            assert engine.weight_version == second and await engine.loaded_adapters() == [first, second]
            await engine.resume_generation()
            await engine.update_adapter(third)  # waits until A or B has ended and its adapter is free
            assert engine.in_flight_requests <= 1 and engine.weight_version == second + 1
    finally:
        await engine.resume_generation()
    assert done["a"].weight_versions == [first] * LONG["max_tokens"]
    assert done["b"].weight_versions == [second] * LONG["max_tokens"]
    assert await engine.loaded_adapters() == [second + 1]


async def test_a_bad_adapter_gets_a_clear_error_and_the_engine_keeps_serving(lora, peft_model, tokenizer, tmp_path):
    engine = lora.engine
    version = await _sync(engine, peft_model, tmp_path, 31)
    good = tmp_path / "seed31"
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    (corrupt / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(EngineError, match=f"vLLM did not load the LoRA adapter in .*corrupt .*version {version}"):
        await engine.update_adapter(corrupt)
    too_big = tmp_path / "too_big"
    shutil.copytree(good, too_big)
    config = json.loads((too_big / "adapter_config.json").read_text())
    (too_big / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    with pytest.raises(EngineError, match="LoRA rank 16 exceeds VLLMEngineConfig.max_lora_rank=8"):
        await engine.update_adapter(too_big)
    with pytest.raises(EngineError, match="does not exist"):
        await engine.update_adapter(tmp_path / "nowhere")
    with pytest.raises(EngineError, match=r"update_weights: .* sync with update_adapter\(folder\)"):
        await engine.update_weights(peft_model.named_parameters())
    assert engine.weight_version == version and await engine.loaded_adapters() == [version]
    batch, versions = await _sample(engine, tokenizer)  # still serving the last good adapter
    assert versions == [version] * len(versions) and _gap(peft_model, batch, 31) < TOLERANCE
    assert await _sync(engine, peft_model, tmp_path, 32) == version + 1
