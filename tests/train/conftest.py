"""A second, fp32 engine and an fp32 training model that training tests may change freely."""

from __future__ import annotations

import anyio
import pytest
import torch


@pytest.fixture(scope="session")
def fp32_engine(model_dir):
    """A second engine, fp32, that these tests may overwrite without disturbing the session engine."""
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    eng = VLLMEngine(VLLMEngineConfig(model=model_dir, max_model_len=1024, kv_cache_gib=0.25, dtype="float32"))
    eng.start_sync()
    yield eng
    anyio.run(eng.close)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


