"""The memory plan with the engine's tensor parallelism T (`engine.tensor_parallel_size`): per-card weights,
activations and KV cache of real model shapes (Qwen2.5-32B, Llama-3-70B) against the formulas, the smallest T that
holds every agent's whole window, the T the plan refuses, and the command's `--tensor-parallel-size`."""

from __future__ import annotations

import json

import pytest

from agentic_rl.cli.command import main
from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.loop.memory_parts import GIB, Levers
from agentic_rl.loop.memory_plan import (
    ModelShape,
    plan_for_config,
    plan_memory,
    run_memory_plan,
    tensor_parallel_sizes,
)

# The published config.json fields of the two models (hand-written: the shapes are what the plan reads).
QWEN32B = dict(model_type="qwen2", hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
               num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False, torch_dtype="bfloat16")  # fmt: skip
LLAMA70B = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, torch_dtype="bfloat16")  # fmt: skip
BF16 = 2
SEQS = 256  # plan_memory's default max_num_seqs


@pytest.fixture(scope="module")
def qwen32b() -> ModelShape:
    return ModelShape.from_config(QWEN32B, name="qwen2.5-32b")


@pytest.fixture(scope="module")
def llama70b() -> ModelShape:
    return ModelShape.from_config(LLAMA70B, name="llama-3-70b")


def _plan(shape, tp=1, *, gpus=8, card=80.0, utilization=0.5, agents=16, window=4096, **kwargs):
    return plan_memory(shape, gpus=gpus, gpu_memory_gib=card, optimizer=Levers(), max_prompt_length=1024,
                       max_response_length=512, n_parallel_agents=agents, max_model_len=window,
                       gpu_memory_utilization=utilization, engine_dtype="bfloat16", tensor_parallel_size=tp,
                       **kwargs)  # fmt: skip


def _by_hand(shape: ModelShape, tp: int, card: float, utilization: float) -> dict[str, float]:
    """The engine's figures per card on an accelerator, from the formulas (`memory_parts` docstring)."""
    h, i, q, d = shape.hidden_size, shape.intermediate_size, shape.q_width, shape.head_dim
    kv_heads = shape.num_key_value_heads // tp if shape.num_key_value_heads >= tp else 1
    batched = 16384 if card >= 70 else 8192  # vLLM's default batch of tokens
    weights = shape.parameters * BF16 / tp / GIB
    activations = (
        batched * BF16 * ((3 * i + q) / tp + 4 * h + 2 * kv_heads * d) + 2 * SEQS * shape.vocab_size * 4
    ) / GIB
    kv_cache = max(utilization * card - weights - activations, 0.0)
    per_token = 2 * shape.num_hidden_layers * kv_heads * d * BF16
    return dict(weights=weights, activations=activations, kv_cache=kv_cache, kv_bytes_per_token=per_token,
                kv_tokens=int(kv_cache * GIB // per_token))  # fmt: skip


# -- per-card parts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen32b", "llama70b"])
def test_the_weights_per_card_divide_by_t(name, request):
    shape = request.getfixturevalue(name)
    whole = _plan(shape, 1).engine
    assert whole.weights == shape.parameters * BF16 / GIB and whole.tensor_parallel_size == 1
    for tp in (2, 4, 8):
        engine = _plan(shape, tp).engine
        assert engine.weights == whole.weights / tp and engine.tensor_parallel_size == tp
        assert engine.share == whole.share == 0.5 * 80  # the share of each card stays utilization x card
        assert engine.kv_cache == pytest.approx(max(engine.share - engine.weights - engine.activations, 0.0))
    assert _plan(shape, 2).engine.weights * 2 == whole.weights  # exact: a power of two


@pytest.mark.parametrize("name", ["qwen32b", "llama70b"])
def test_every_engine_figure_per_card_is_the_formulas(name, request):
    shape = request.getfixturevalue(name)
    for tp in tensor_parallel_sizes(shape, 8):
        engine = _plan(shape, tp, utilization=0.9).engine
        expected = _by_hand(shape, tp, 80.0, 0.9)
        assert engine.weights == pytest.approx(expected["weights"], rel=1e-12)
        assert engine.activations == pytest.approx(expected["activations"], rel=1e-12)
        assert engine.kv_cache == pytest.approx(expected["kv_cache"], rel=1e-9, abs=1e-12)
        assert engine.kv_bytes_per_token == expected["kv_bytes_per_token"]
        assert engine.kv_tokens == int(engine.kv_cache * GIB // engine.kv_bytes_per_token)


def test_kv_bytes_per_token_per_card_halve_while_the_kv_heads_split(llama70b):
    per_token = {tp: _plan(llama70b, tp, gpus=16).engine.kv_bytes_per_token for tp in (1, 2, 4, 8, 16)}
    assert per_token[1] == llama70b.kv_bytes_per_token(BF16) == 2 * 80 * 8 * 128 * BF16
    for tp in (2, 4, 8):  # 8 KV heads: split while T <= 8
        assert per_token[tp] * 2 == per_token[tp // 2]
    assert per_token[16] == per_token[8] == 2 * 80 * 1 * 128 * BF16  # one replicated KV head per card


def test_the_cpu_keeps_its_kv_cache_per_rank(qwen32b):
    one, two = (_plan(qwen32b, tp, card=500.0, platform="cpu", kv_cache_gib=3.0).engine for tp in (1, 2))
    assert one.kv_cache == two.kv_cache == 3.0 and two.weights == one.weights / 2
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.kv_tokens == int(3.0 * GIB // two.kv_bytes_per_token)


def test_a_32b_bf16_engine_needs_two_cards_at_half_of_80_gib(qwen32b):
    whole = _plan(qwen32b, 1).engine
    assert 0.5 * 80 - whole.weights - whole.activations <= 0  # 61 GiB of weights in a 40 GiB share
    assert whole.kv_cache == 0 and whole.kv_tokens == 0 and not whole.holds_window
    for tp in (2, 4):
        engine = _plan(qwen32b, tp).engine
        expected = _by_hand(qwen32b, tp, 80.0, 0.5)
        assert engine.kv_cache == pytest.approx(expected["kv_cache"]) and engine.kv_cache > 0
        assert engine.kv_tokens == expected["kv_tokens"] and engine.holds_window


# -- the smallest T that holds every agent's whole window ---------------------------------------------------------


def test_the_recommendation_is_the_smallest_t_that_holds_every_window(qwen32b):
    sizes = tensor_parallel_sizes(qwen32b, 8)
    assert sizes == tuple(t for t in (1, 2, 4, 8) if 40 % t == 0 and (8 % t == 0 or t % 8 == 0)) == (1, 2, 4, 8)
    tokens = {tp: _by_hand(qwen32b, tp, 80.0, 0.5)["kv_tokens"] for tp in sizes}
    assert tokens[1] < tokens[2] < tokens[4] < tokens[8]
    window = 8192
    agents = (tokens[2] + tokens[4]) // 2 // window  # more than two cards hold, fewer than four do
    assert tokens[2] < agents * window <= tokens[4]
    for tp in sizes:
        plan = _plan(qwen32b, tp, agents=agents, window=window)
        assert [e.tensor_parallel_size for e in plan.tensor_parallel_options] == list(sizes)
        assert plan.recommended_tensor_parallel_size == 4 == min(t for t in sizes if tokens[t] >= agents * window)
        summary = plan.summary()
        assert f"engine at tensor parallel {tp}:" in summary
        assert ("engine.tensor_parallel_size=4 is the smallest" in summary) == (tp != 4)
        assert (plan.tensor_parallel_advice() is None) == (tp == 4)
    payload = _plan(qwen32b, 2, agents=agents, window=window).to_dict()
    assert payload["tensor_parallel_size"] == payload["engine"]["tensor_parallel_size"] == 2
    assert payload["recommended_tensor_parallel_size"] == 4
    assert [o["kv_tokens"] for o in payload["tensor_parallel_options"]] == [tokens[t] for t in sizes]
    assert json.loads(json.dumps(payload)) == payload


def test_no_t_holds_a_window_too_many(qwen32b):
    tokens_at_8 = _by_hand(qwen32b, 8, 80.0, 0.5)["kv_tokens"]
    plan = _plan(qwen32b, 2, agents=tokens_at_8 // 4096 + 1, window=4096)
    assert plan.recommended_tensor_parallel_size is None
    assert "no engine.tensor_parallel_size the run allows (1, 2, 4, 8) holds" in plan.summary()


def test_the_summary_says_t_and_the_per_card_engine(qwen32b):
    plan = _plan(qwen32b, 2)
    e = plan.engine
    summary = plan.summary()
    assert "engine at tensor parallel 2:" in summary and f"{e.share:.1f} GiB per card" in summary
    assert f"weights {e.weights:.1f}" in summary and f"KV cache it leaves {e.kv_cache:.1f}" in summary
    assert f"{e.kv_tokens} KV tokens" in summary


# -- refusals and the config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp, gpus, match",
    [(3, 8, r"tensor_parallel_size=3 does not divide gpus=8"),
     (16, 16, r"tensor_parallel_size=16 does not divide the model's num_attention_heads=40"),
     (5, 10, r"tensor_parallel_size=5 neither divides nor is a multiple of the model's num_key_value_heads=8"),
     (0, 8, r"tensor_parallel_size=0 must be a positive integer")],
)  # fmt: skip
def test_a_t_vllm_refuses_is_refused_naming_both_numbers(qwen32b, tp, gpus, match):
    with pytest.raises(ConfigError, match=match):
        _plan(qwen32b, tp, gpus=gpus)
    assert tp not in tensor_parallel_sizes(qwen32b, gpus)


def test_the_config_gives_t_to_the_plan_and_the_run(qwen32b, tmp_path):
    config = TrainConfig(engine={"tensor_parallel_size": 2, "dtype": "bfloat16"})
    plan = plan_for_config(config, qwen32b, gpus=8, gpu_memory_gib=80.0)
    assert plan.tensor_parallel_size == 2 and plan.engine.weights == qwen32b.parameters * BF16 / 2 / GIB
    with pytest.raises(ConfigError, match="gpus=6"):
        plan_for_config(TrainConfig(engine={"tensor_parallel_size": 4}), qwen32b, gpus=6, gpu_memory_gib=80.0)
    (tmp_path / "config.json").write_text(json.dumps(QWEN32B))
    here = run_memory_plan(config, tmp_path, world_size=2)  # what the training loop calls (on this CPU)
    assert here.platform == "cpu" and here.tensor_parallel_size == 2 and here.gpus == 2


# -- the command --------------------------------------------------------------------------------------------------


def test_the_command_takes_tensor_parallel_size(tmp_path, capsys, qwen32b):
    model = tmp_path / "qwen32b.json"
    model.write_text(json.dumps(QWEN32B))
    base = ["plan", "--model", str(model), "--gpus", "8", "--gpu-memory-gib", "80", "--set", "engine.dtype=bfloat16"]
    assert main([*base, "--set", "engine.tensor_parallel_size=4", "--tensor-parallel-size", "2", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["tensor_parallel_size"] == payload["engine"]["tensor_parallel_size"] == 2  # the flag wins
    assert payload["engine"]["weights"] == round(qwen32b.parameters * BF16 / 2 / GIB, 6)
    assert [o["tensor_parallel_size"] for o in payload["tensor_parallel_options"]] == [1, 2, 4, 8]
    assert main([*base, "--set", "engine.tensor_parallel_size=4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensor_parallel_size"] == 4  # else the config's
    assert main([*base, "--tensor-parallel-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "engine tensor parallel 2" in out and "1/2 of the model" in out and "KV tokens" in out
    assert main([*base, "--tensor-parallel-size", "3"]) == 2
    err = capsys.readouterr().err
    assert "tensor_parallel_size=3 does not divide gpus=8" in err and "Traceback" not in err
