"""The two weight-sync paths of the real engine (tiny model): in-place copy and vLLM's `reload_weights`."""

from __future__ import annotations

import anyio
import pytest
import torch

PROMPTS = [list(range(100, 140)), list(range(300, 317))]
GREEDY = {"max_tokens": 12, "min_tokens": 12, "temperature": 0.0}


def _tiny_engine(dtype: str):
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model

    eng = VLLMEngine(VLLMEngineConfig(model=resolve_model("tiny-random-smollm2"), dtype=dtype, max_model_len=256,
                                      kv_cache_gib=0.05))  # fmt: skip
    eng.start_sync()
    return eng


# Session-scoped, never closed before the session ends: closing a vLLM engine in this process tears down vLLM's
# process-wide parallel state, which every other engine still running (the session engine) needs for its next step.
@pytest.fixture(scope="session")
def tiny_fp32_engine():
    eng = _tiny_engine("float32")
    yield eng
    anyio.run(eng.close)


@pytest.fixture(scope="session")
def tiny_bf16_engine():
    eng = _tiny_engine("bfloat16")
    yield eng
    anyio.run(eng.close)


@pytest.fixture(params=["float32", "bfloat16"])
def tiny_engine(request):
    """A tiny-model engine per dtype: fp32 linears are served from packed oneDNN copies on this CPU, bf16 from
    their weights (where the CPU has no bf16 oneDNN matmul)."""
    return request.getfixturevalue("tiny_fp32_engine" if request.param == "float32" else "tiny_bf16_engine")


@pytest.fixture
def tiny_model(tiny_engine):
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model

    dtype = getattr(torch, tiny_engine.config.dtype)
    return AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=dtype).eval()


def _perturb(model, scale: float) -> None:
    """Scale every weight but the norms, fused q/k/v and gate/up shards and the tied embedding included."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(scale)


async def _outputs(engine):
    return [await engine.generate(p, GREEDY) for p in PROMPTS]


async def _sync(engine, model, path: str) -> None:
    engine.config.weight_sync = path
    try:
        await engine.update_weights(model.named_parameters())
    finally:
        engine.config.weight_sync = "in_place"


def _hf_logprobs(model, prompt, token_ids):
    ids = torch.tensor([prompt + list(token_ids)])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits.float(), -1)[0]
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(token_ids)]


async def test_in_place_copy_and_reload_serve_the_same_weights(tiny_engine, tiny_model):
    version = tiny_engine.weight_version
    _perturb(tiny_model, 1.5)
    await _sync(tiny_engine, tiny_model, "in_place")
    assert tiny_engine.last_weight_sync.startswith("in-place copy of 20 tensors")  # 2 layers x 9, embedding, norm
    in_place = await _outputs(tiny_engine)

    await _sync(tiny_engine, tiny_model, "reload")
    assert tiny_engine.last_weight_sync.startswith("vLLM reload_weights (in-place copy not used: weight_sync is")
    reloaded = await _outputs(tiny_engine)
    assert tiny_engine.weight_version == version + 2
    for a, b in zip(in_place, reloaded, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    if tiny_engine.config.dtype == "float32":  # and both match the training model
        for prompt, g in zip(PROMPTS, in_place, strict=True):
            assert _hf_logprobs(tiny_model, prompt, g.token_ids) == pytest.approx(g.logprobs, abs=1e-4)

    # in-place again after a reload (which leaves its own loader wrappers behind), back to what reload gave
    await _sync(tiny_engine, tiny_model, "in_place")
    for a, b in zip(await _outputs(tiny_engine), reloaded, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


async def test_in_place_copy_changes_the_output_and_restoring_restores_it(tiny_engine, tiny_model):
    await _sync(tiny_engine, tiny_model, "in_place")
    before = await _outputs(tiny_engine)
    original = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    with torch.no_grad():
        for name, p in tiny_model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn_like(p) * 0.2)
    await _sync(tiny_engine, tiny_model, "in_place")
    assert [g.token_ids for g in await _outputs(tiny_engine)] != [g.token_ids for g in before]
    with torch.no_grad():
        for name, p in tiny_model.named_parameters():
            p.copy_(original[name])
    await _sync(tiny_engine, tiny_model, "in_place")
    assert [g.token_ids for g in await _outputs(tiny_engine)] == [g.token_ids for g in before]


async def test_the_engine_keeps_no_reference_to_the_synced_tensors(tiny_engine, tiny_model):
    await _sync(tiny_engine, tiny_model, "in_place")
    before = await _outputs(tiny_engine)
    _perturb(tiny_model, 3.0)  # the trainer's next step, not synced
    after = await _outputs(tiny_engine)
    assert [g.logprobs for g in after] == [g.logprobs for g in before]


def _packed_layers(llm) -> list[str]:
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    return [n for n, m in model.named_modules() if n.endswith("qkv_proj") and m.weight.numel() == 0]


async def test_a_packed_layer_given_only_some_of_its_shards_is_rejected_and_keeps_its_weights(tiny_engine, tiny_model):
    from agentic_rl.errors import EngineError

    if not await tiny_engine.call(_packed_layers):
        pytest.skip("this engine serves its q/k/v layers from their weights: any subset of shards loads in place")
    await _sync(tiny_engine, tiny_model, "in_place")
    before = await _outputs(tiny_engine)
    q = tiny_model.model.layers[0].self_attn.q_proj.weight.detach() * 2
    with pytest.raises(EngineError, match=r"only some shards of the packed layers \['model.layers.0.self_attn.qkv"):
        await tiny_engine.update_weights([("model.layers.0.self_attn.q_proj.weight", q)])
    assert [g.logprobs for g in await _outputs(tiny_engine)] == [g.logprobs for g in before]


@pytest.mark.parametrize("path", ["in_place", "reload"])
async def test_fp32_weights_synced_into_a_bf16_engine_log_one_counted_line(tiny_bf16_engine, path, caplog):
    """vLLM warns per tensor whose dtype differs from the engine's; the engine counts them in one line instead."""
    import logging

    from transformers import AutoModelForCausalLM

    from agentic_rl.engine.load_log import VLLM_LOADER_LOGGER
    from agentic_rl.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)
    reached: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = reached.append  # sees what passes the loader logger's filters (vLLM's loggers do not propagate)
    loader_log = logging.getLogger(VLLM_LOADER_LOGGER)
    loader_log.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="agentic_rl.engine.load_log"):
            await _sync(tiny_bf16_engine, model, path)
    finally:
        loader_log.removeHandler(handler)
    assert not [r for r in reached if r.getMessage().startswith("Attempted to load weight")]
    lines = [r.getMessage() for r in caplog.records if r.name == "agentic_rl.engine.load_log"]
    assert len(lines) == 1, lines
    assert "weight tensors stored as torch.float32 served as torch.bfloat16" in lines[0]
    assert int(lines[0].split(": ")[1].split()[0]) > 0
