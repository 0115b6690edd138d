"""The memory plan (`agentic-rl plan`, `loop.memory_plan`): exact parameter counts against real models, activation
bytes against what autograd keeps, the levers' effects, the plan's sums, the command end to end and its refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentic_rl.cli.command import main
from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.loop.memory_parts import GIB, Levers, layer_activation_bytes
from agentic_rl.loop.memory_plan import ModelShape, measured_line, plan_for_config, plan_memory, run_memory_plan
from agentic_rl.train.grpo_config import GRPOConfig
from agentic_rl.train.lora import DEFAULT_TARGET_MODULES, LoRAConfig

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "examples" / "model_shapes"
QWEN = {name: SHAPES / f"qwen2.5-{name}.json" for name in ("7b", "14b", "32b")}
CLI = Path(sys.executable).with_name("agentic-rl")


def _plan(shape, levers=None, *, gpus=8, card=80.0, kl=0.0, rows=2, **kwargs):
    levers = levers or Levers()
    settings = dict(max_prompt_length=1024, max_response_length=512, n_parallel_agents=16, max_model_len=1536)
    return plan_memory(shape, gpus=gpus, gpu_memory_gib=card, optimizer=levers, micro_batch_size=rows, kl_coef=kl,
                       **{**settings, **kwargs})  # fmt: skip


@pytest.fixture(scope="module")
def qwen7b() -> ModelShape:
    return ModelShape.load(QWEN["7b"])


# -- parameter counts -------------------------------------------------------------------------------------------


def test_the_count_is_exact_for_the_real_smollm2(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    assert ModelShape.load(model_dir).parameters == sum(p.numel() for p in model.parameters()) == 134_515_008
    assert ModelShape.load(model_dir / "config.json").tie_word_embeddings


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama_biased", "qwen2_tied"])
def test_the_count_is_exact_for_random_init_models(kind):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    dims = dict(vocab_size=1000, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, tie_word_embeddings=kind == "qwen2_tied")  # fmt: skip
    config_class, model_class, extra = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
        "qwen2_tied": (Qwen2Config, Qwen2ForCausalLM, {}),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 48}),
        "llama_biased": (LlamaConfig, LlamaForCausalLM, {"attention_bias": True, "mlp_bias": True}),
    }[kind]
    config = config_class(**dims, **extra)
    model = model_class(config)
    assert ModelShape.from_config(config.to_dict()).parameters == sum(p.numel() for p in model.parameters())


def test_the_qwen_shapes_count_their_published_sizes():
    counts = {name: ModelShape.load(path).parameters for name, path in QWEN.items()}
    assert counts == {"7b": 7_615_616_512, "14b": 14_770_033_664, "32b": 32_763_876_352}  # 7.62B, 14.77B, 32.76B


def test_lora_counts_r_times_in_plus_out_of_each_targeted_linear(model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentic_rl.train.lora import wrap_model

    assert tuple(DEFAULT_TARGET_MODULES) == Levers().lora_targets  # the plan's default is the trainer's
    config = AutoConfig.from_pretrained(str(model_dir))
    config.num_hidden_layers = 2
    shape = ModelShape.from_config(config.to_dict())
    for targets in (list(DEFAULT_TARGET_MODULES), ["q_proj", "v_proj"], "all-linear"):
        model = wrap_model(AutoModelForCausalLM.from_config(config), LoRAConfig(rank=4, target_modules=targets))
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert shape.lora_parameters(4, targets) == trained, targets
    with pytest.raises(ConfigError, match="fits no linear layer"):
        shape.lora_parameters(4, ["lm_head_x"])


# -- activations against autograd's saved tensors ----------------------------------------------------------------


def _saved_bytes(model, mode: str, rows: int, tokens: int, response: int) -> int:
    """Bytes of the tensors autograd keeps for a forward of `rows` x `tokens` (parameters apart; under autocast,
    the bf16 weight copies count), with one padded row as training batches have."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    ids = torch.randint(0, model.config.vocab_size, (rows, tokens))
    mask = torch.ones(rows, tokens, dtype=torch.long)
    mask[0, :10] = 0
    keep = torch.arange(tokens - response - 1, tokens - 1)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        model(input_ids=ids, attention_mask=mask, logits_to_keep=keep)
    return sum(seen.values())


@pytest.mark.parametrize("mode", ["fp32", "autocast", "bf16"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_one_layers_activations_are_what_autograd_keeps(kind, mode):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    dims = dict(vocab_size=512, hidden_size=192, intermediate_size=512, num_attention_heads=6, num_key_value_heads=2)
    rows, tokens, response = 2, 96, 48
    saved = {}
    for layers in (1, 2):
        model = model_class(config_class(**dims, num_hidden_layers=layers))
        if mode == "bf16":  # bf16 parameters, as FSDP2's mixed precision gathers them
            model = model.to(torch.bfloat16)
        saved[layers] = _saved_bytes(model, mode, rows, tokens, response)
    shape = ModelShape.from_config(model.config.to_dict())
    measured = saved[2] - saved[1]
    if mode == "autocast":  # autocast's bf16 copies of the layer's weights are the plan's "bf16 weight copies"
        measured -= 2 * shape.layer_linear_weights
    planned = layer_activation_bytes(shape, Levers(), mode, tokens) * rows * tokens
    assert planned == pytest.approx(measured, rel=0.02)


# -- the levers ---------------------------------------------------------------------------------------------------


def test_fsdp_on_w_cards_divides_the_sharded_parts_by_w(qwen7b):
    whole = _plan(qwen7b, Levers(), gpus=1, kl=0.1).trainer
    for gpus in (2, 8):
        sharded = _plan(qwen7b, Levers(sharding="fsdp"), gpus=gpus, kl=0.1).trainer
        for name in ("weights", "optimizer", "reference"):
            assert sharded.resident[name] * gpus == pytest.approx(whole.resident[name])
        assert sharded.step["gradients"] * gpus == pytest.approx(whole.step["gradients"])
        assert sharded.backward["fsdp gathered"] > 0 and not sharded.after_backward
    assert "fsdp gathered" not in _plan(qwen7b, Levers(sharding="fsdp"), gpus=1).trainer.backward  # one rank: whole
    replicated = _plan(qwen7b, Levers(), gpus=8).trainer
    assert replicated.after_backward["gradient all-reduce"] == pytest.approx(whole.step["gradients"])


def test_sixteen_bytes_per_trained_parameter_and_the_reference(qwen7b):
    plan = _plan(qwen7b, Levers(), gpus=1, kl=0.1)
    t, p = plan.trainer, qwen7b.parameters
    assert (t.resident["weights"], t.step["gradients"], t.resident["optimizer"]) == pytest.approx((4 * p / GIB, 4 * p / GIB, 8 * p / GIB))
    assert t.resident["reference"] == pytest.approx(4 * p / GIB)
    assert _plan(qwen7b, Levers(precision="bf16"), kl=0.1).trainer.resident["reference"] == pytest.approx(2 * p / GIB)
    assert _plan(qwen7b, Levers(), kl=0.0).trainer.resident["reference"] == 0
    assert _plan(qwen7b, Levers(lora_rank=16), kl=0.1).trainer.resident["reference"] == 0  # the base is the reference


def test_bf16_roughly_halves_activations_and_checkpointing_shrinks_them(qwen7b):
    fp32 = _plan(qwen7b, Levers(sharding="fsdp")).trainer
    bf16 = _plan(qwen7b, Levers(sharding="fsdp", precision="bf16")).trainer
    # bf16 tensors are half of fp32 ones; the norms' fp32 statistics keep it a little above half
    assert 0.5 * fp32.backward["activations"] < bf16.backward["activations"] < 0.6 * fp32.backward["activations"]
    assert bf16.backward["logits"] < fp32.backward["logits"]
    checkpointed = _plan(qwen7b, Levers(sharding="fsdp", activation_checkpointing=True)).trainer
    assert checkpointed.backward["activations"] == pytest.approx(fp32.activations_checkpointed)
    assert checkpointed.backward["activations"] < fp32.backward["activations"] / 4
    assert checkpointed.activations_full == pytest.approx(fp32.backward["activations"])
    autocast = _plan(qwen7b, Levers(precision="bf16"), gpus=1).trainer  # unsharded bf16: autocast's weight cache
    assert autocast.step["bf16 weight copies"] == pytest.approx(2 * (28 * qwen7b.layer_linear_weights + 152064 * 3584) / GIB)


def test_lora_trains_only_the_adapter(qwen7b):
    full = _plan(qwen7b, Levers(), gpus=1).trainer
    plan = _plan(qwen7b, Levers(lora_rank=16), gpus=1)
    adapter = qwen7b.lora_parameters(16, DEFAULT_TARGET_MODULES)
    assert plan.trained_parameters == adapter < qwen7b.parameters / 100
    assert plan.trainer.step["gradients"] == pytest.approx(4 * adapter / GIB)
    assert plan.trainer.resident["optimizer"] == pytest.approx(8 * adapter / GIB)
    assert plan.trainer.resident["weights"] == pytest.approx(full.resident["weights"] + 4 * adapter / GIB)


def test_offload_moves_the_shards_to_host_memory(qwen7b):
    on_card = _plan(qwen7b, Levers(sharding="fsdp"), kl=0.1).trainer
    offloaded = _plan(qwen7b, Levers(sharding="fsdp", cpu_offload=True), kl=0.1).trainer
    for name in ("weights", "optimizer", "reference"):
        assert offloaded.resident[name] == 0 and offloaded.host[name] == pytest.approx(on_card.resident[name])
    assert offloaded.step["gradients"] == 0 and offloaded.host["gradients"] == pytest.approx(on_card.step["gradients"])
    assert offloaded.backward == on_card.backward  # activations and gathered units stay on the card
    assert offloaded.host_gib == pytest.approx(sum(offloaded.host.values()))
    solo = _plan(qwen7b, Levers(sharding="fsdp", cpu_offload=True), gpus=1).trainer  # one rank shards to offload
    assert solo.host["weights"] == pytest.approx(4 * qwen7b.parameters / GIB)


def test_the_totals_are_the_sums_of_their_parts(qwen7b):
    for levers, gpus, sleep in ((Levers(), 8, False), (Levers(sharding="fsdp", precision="bf16"), 8, True), (Levers(lora_rank=8), 2, False)):  # fmt: skip
        plan = _plan(qwen7b, levers, gpus=gpus, kl=0.05, sleep_while_training=sleep)
        t, e = plan.trainer, plan.engine
        phase = max(sum(t.backward.values()), sum(t.after_backward.values()))
        assert t.peak_gib == pytest.approx(sum(t.resident.values()) + sum(t.step.values()) + phase)
        assert t.resident_gib == pytest.approx(sum(t.resident.values()))
        assert e.share == pytest.approx(0.5 * 80) and e.kv_cache == pytest.approx(e.share - e.weights - e.activations)
        assert plan.card_peak_gib == pytest.approx(max(t.peak_gib + e.asleep, t.resident_gib + e.share))
        assert plan.trainer_budget_gib == pytest.approx(80 if sleep else 40)
        assert plan.host_gib == pytest.approx(t.host_gib + e.host)
        payload = plan.to_dict()
        assert payload["trainer"]["peak_gib"] == pytest.approx(t.peak_gib, abs=1e-5)
        assert json.loads(json.dumps(payload)) == payload


def test_the_kv_cache_and_what_it_holds(qwen7b):
    plan = _plan(qwen7b, card=141.0, n_parallel_agents=64, max_model_len=8192, gpu_memory_utilization=0.6)
    e = plan.engine
    assert e.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    assert e.kv_tokens == int(e.kv_cache * GIB // 57344) and e.agents_at_max_model_len == e.kv_tokens // 8192
    assert e.holds_window and e.holds_agents == (64 * 8192 <= e.kv_tokens)
    fp32 = _plan(qwen7b, card=141.0, engine_dtype="float32").engine
    assert fp32.weights == pytest.approx(2 * e.weights) and fp32.kv_bytes_per_token == 2 * e.kv_bytes_per_token
    on_cpu = _plan(qwen7b, card=500.0, platform="cpu", kv_cache_gib=3.0).engine
    assert on_cpu.kv_cache == 3.0 and on_cpu.asleep == on_cpu.share  # the CPU engine never sleeps


def test_the_smallest_set_of_levers_and_the_single_ones():
    shape = ModelShape.load(QWEN["14b"])
    plan = _plan(shape, Levers(), card=80.0, rows=1)
    assert not plan.fits and plan.smallest_fitting is not None
    best = next(o for o in plan.options if o.levers == plan.smallest_fitting)
    assert best.fits and all(not o.fits for o in plan.options if len(o.levers) < len(best.levers))
    assert all("fsdp" in o.levers for o in plan.options if "cpu_offload" in o.levers)
    roomy = _plan(ModelShape.load(QWEN["7b"]), Levers(), card=10_000.0)
    assert roomy.fits and roomy.smallest_fitting == () and roomy.adding == ()
    near = _plan(shape, Levers(sharding="fsdp", activation_checkpointing=True), card=141.0, rows=1)
    assert set(near.adding) <= {"bf16", "cpu_offload", "lora"}


def test_the_engine_can_fail_whatever_the_levers():
    plan = _plan(ModelShape.load(QWEN["32b"]), Levers(), card=80.0)  # 61 GiB of bf16 weights in a 40 GiB share
    assert plan.engine.kv_cache == 0 and not plan.engine.holds_window and not plan.fits
    assert plan.startup_gib > 80 and not plan.startup_fits  # the whole fp32 model before sharding


def test_a_training_config_and_this_machine(model_dir):
    config = TrainConfig(optimizer=GRPOConfig(micro_batch_size=3, kl_coef=0.1, max_response_length=100),
                         rollout={"max_prompt_length": 300, "max_response_length": 200})  # fmt: skip
    plan = plan_for_config(config, ModelShape.load(model_dir), gpus=1, gpu_memory_gib=16.0, platform="cpu")
    assert (plan.rows, plan.tokens_per_row, plan.response_tokens) == (3, 400, 100)
    assert plan.engine.max_model_len == 500 and plan.engine.dtype == "float32" and plan.trainer.resident["reference"] > 0
    here = run_memory_plan(config, model_dir, world_size=1)
    assert here.platform == "cpu" and here.gpu_memory_gib > 1
    line = measured_line(here)
    assert "measured" in line and "peak RSS" in line and "planned" in line
    from ascend.device import Platform

    assert Platform("cpu").peak_memory_bytes() > 100 * 2**20  # this process holds torch and a model


def test_the_accelerators_peak_comes_from_their_allocator(monkeypatch):
    import types

    from ascend.device import Platform

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda rank: 7 << 30)
    assert Platform("cuda", 8).peak_memory_bytes(3) == 7 << 30
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(max_memory_allocated=lambda rank: 5 << 30), raising=False)
    assert Platform("npu", 8).peak_memory_bytes(0) == 5 << 30


# -- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, match",
    [
        ({"hidden_size": 64}, "lacks vocab_size"),
        ({**json.loads(QWEN["7b"].read_text()), "num_hidden_layers": -2}, "num_hidden_layers=-2 is not a positive"),
        ({**json.loads(QWEN["7b"].read_text()), "num_key_value_heads": 3}, "not a multiple"),
        ({**json.loads(QWEN["7b"].read_text()), "num_experts": 8}, "mixture-of-experts"),
        ([1, 2], "JSON object"),
    ],
)
def test_configs_the_plan_cannot_read(config, match):
    with pytest.raises(ConfigError, match=match):
        ModelShape.from_config(config)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"gpus": 0}, "gpus=0"), ({"card": -80.0}, "gpu_memory_gib=-80"), ({"n_parallel_agents": -1}, "n_parallel_agents"),
     ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"), ({"platform": "tpu"}, "platform"),
     ({"engine_dtype": "int8"}, "engine dtype"), ({"rows": 0}, "micro_batch_size")],
)  # fmt: skip
def test_numbers_the_plan_refuses(qwen7b, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        _plan(qwen7b, **kwargs)


# -- the command --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, card", [("7b", 80), ("14b", 141), ("32b", 80)])
def test_the_command_prints_the_plan_as_json(name, card):
    out = subprocess.run(
        [str(CLI), "plan", "--model", str(QWEN[name]), "--gpus", "8", "--gpu-memory-gib", str(card), "--json",
         "--precision", "bf16", "--activation-checkpointing", "--set", "engine.dtype=bfloat16"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    plan = json.loads(out.stdout)
    assert plan["gpus"] == 8 and plan["gpu_memory_gib"] == card and plan["levers"] == ["bf16", "activation_checkpointing"]
    assert plan["parameters"] == ModelShape.load(QWEN[name]).parameters and plan["engine"]["dtype"] == "bfloat16"
    trainer = plan["trainer"]
    phases = sum(trainer["resident"].values()) + sum(trainer["step"].values()) + max(sum(trainer["backward"].values()), sum(trainer["after_backward"].values()))  # fmt: skip
    assert math.isclose(trainer["peak_gib"], phases, abs_tol=1e-4)
    assert isinstance(plan["fits"], bool) and len(plan["options"]) == 24


def test_flags_override_the_config_and_the_table_prints(tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text("optimizer:\n  micro_batch_size: 2\n  sharding: replicate\nrollout:\n  n_parallel_agents: 8\n")
    args = ["plan", "--model", str(QWEN["7b"]), "--gpus", "8", "--gpu-memory-gib", "141", "--config", str(config),
            "--set", "optimizer.micro_batch_size=1", "--cpu-offload", "--lora", "32", "--max-model-len", "4096", "--json"]  # fmt: skip
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["levers"] == ["fsdp", "cpu_offload", "lora"] and plan["micro_batch"]["rows"] == 1
    assert plan["engine"]["max_model_len"] == 4096 and plan["engine"]["n_parallel_agents"] == 8
    assert plan["trained_parameters"] == ModelShape.load(QWEN["7b"]).lora_parameters(32, DEFAULT_TARGET_MODULES)
    assert main(["plan", "--model", str(QWEN["14b"]), "--gpus", "8", "--gpu-memory-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "trainer" in out and "KV cache" in out and "verdict:" in out and "smallest set that fits" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "{missing}/config.json"], "no such file"),
        (["--model", "{folder}"], "holds no config.json"),
        (["--model", "{fieldless}"], "lacks vocab_size"),
        (["--model", "{qwen}", "--set", "optimizer.micro_batch_size=-1"], "micro_batch_size"),
        (["--model", "{qwen}", "--gpus", "-8"], "gpus=-8"),
        (["--model", "{qwen}", "--gpu-memory-gib", "-80"], "gpu_memory_gib=-80"),
        (["--model", "{qwen}", "--lora", "-4"], "rank"),
        (["--model", "{qwen}", "--config", "{missing}/train.yaml"], "No such file"),
        (["--model", "no-such-model"], "unknown model"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, args, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "fieldless.json").write_text('{"model_type": "llama"}')
    paths = {"missing": tmp_path / "missing", "folder": tmp_path / "folder", "fieldless": tmp_path / "fieldless.json", "qwen": QWEN["7b"]}  # fmt: skip
    argv = [a.format(**paths) for a in args]
    defaults = [] if "--gpus" in argv else ["--gpus", "8"]
    defaults += [] if "--gpu-memory-gib" in argv else ["--gpu-memory-gib", "80"]
    assert main(["plan", *argv, *defaults]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentic-rl plan: error:") and message in err and "\n" not in err and "Traceback" not in err


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    out = subprocess.run([str(CLI), "plan", "--model", str(tmp_path), "--gpus", "8", "--gpu-memory-gib", "80"],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"agentic-rl plan: error: {tmp_path} holds no config.json"]
