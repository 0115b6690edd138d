"""A second, fp32 engine, an fp32 training model that training tests may change freely, and the tiny random model."""

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


@pytest.fixture(scope="module")
def tiny():
    """The tiny random SmolLM2 (fp32) for cheap training steps."""
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)
