"""LoRA training: only the adapter trains, a fresh adapter is the base model exactly, the KL reference is the base
with the adapter disabled, checkpoints restore the adapter and optimizer, and a merged adapter is a plain model."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import torch
from support.train_runs import answer_group, write_train_config

from agentic_rl.cli import main
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.loop.weight_sync import restore_weights
from agentic_rl.train.checkpoints import load_state, save_checkpoint, weights_digest
from agentic_rl.train.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoRAConfig, adapter_model, wrap_model
from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer


def _lora_trainer(model, tokenizer, **config):
    settings = {"lr": 1e-3, "micro_batch_size": 2, "lora": LoRAConfig(rank=8, alpha=16)} | config
    return GRPOTrainer(copy.deepcopy(model), pad_token_id=tokenizer.pad_token_id, config=GRPOConfig(**settings))


def test_lora_settings_are_checked_and_a_bad_one_is_named(tiny, tmp_path):
    from agentic_rl.loop import load_train_config

    assert LoRAConfig().target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = load_train_config(write_train_config(tmp_path), ["optimizer.lora.rank=8"])
    assert config.optimizer.lora == LoRAConfig(rank=8)
    with pytest.raises(ConfigError, match=r"TrainConfig\.optimizer\.lora\.rnk is not a known field"):
        load_train_config(write_train_config(tmp_path), ["optimizer.lora.rnk=8"])
    with pytest.raises(ConfigError, match=r"GRPOConfig\.lora\.rank=0"):
        GRPOConfig(lora={"rank": 0})
    with pytest.raises(ConfigError, match=r"LoRAConfig\.dropout=1\.0"):
        LoRAConfig(dropout=1.0)
    with pytest.raises(ConfigError, match=r"target_modules=\['wq'\] fits no layer of LlamaForCausalLM"):
        wrap_model(copy.deepcopy(tiny), LoRAConfig(target_modules=["wq"]))
    full = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=0)
    with pytest.raises(TrainingError, match="needs a LoRA model"):
        full.save_adapter("/nonexistent")
    lora = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=0, config=GRPOConfig(lora=LoRAConfig(rank=4)))
    with pytest.raises(TrainingError, match="save_adapter"):
        lora.named_weights()


def test_a_fresh_adapter_starts_the_step_from_exactly_the_base_models_logprobs(hf_model, tokenizer):
    """peft initializes B to 0: the adapter adds exact zeros, so a LoRA step's forward (its loss, and its logprob
    gap to the sampling logprobs) is the full fine-tuning step's, bit for bit."""
    trajectories = answer_group(hf_model, tokenizer, [1.0, 0.0, 1.0, 0.0])
    batch = pack_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)
    lora = _lora_trainer(hf_model, tokenizer)
    with torch.no_grad():
        assert torch.equal(response_logprobs(adapter_model(lora.module), batch), response_logprobs(hf_model, batch))
    full = GRPOTrainer(copy.deepcopy(hf_model), pad_token_id=tokenizer.pad_token_id,
                       config=GRPOConfig(lr=1e-3, micro_batch_size=2))  # fmt: skip
    with_lora, without = lora.train_step(trajectories).as_metrics(), full.train_step(trajectories).as_metrics()
    assert with_lora["loss"] == without["loss"] and with_lora["logprob_diff"] == without["logprob_diff"]
    assert with_lora["logprob_diff"] < 1e-6  # on-policy: the logprobs the group was recorded with
    assert with_lora["grad_norm"] > 0


def test_only_the_adapter_trains_and_the_base_weights_stay_bit_identical(hf_model, tokenizer):
    trajectories = answer_group(hf_model, tokenizer, [1.0, 0.0, 0.0, 1.0])
    trainer = _lora_trainer(hf_model, tokenizer)
    adapter = {n: p for n, p in trainer.module.named_parameters() if "lora_" in n}
    trained = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in adapter.values()}
    start = {n: p.detach().clone() for n, p in adapter.items()}
    trainer.train_step(trajectories)
    after_one = {n: p.detach().clone() for n, p in adapter.items()}
    trainer.train_step(trajectories)
    base = dict(hf_model.named_parameters())
    for name, p in trainer.module.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base[name.removeprefix("base_model.model.").replace(".base_layer", "")]), name
    # B starts at 0, so A's first gradient is 0: the first step moves B, the second A too
    assert any(not torch.equal(start[n], after_one[n]) for n in start if "lora_B" in n)
    assert all(torch.equal(start[n], after_one[n]) for n in start if "lora_A" in n)
    assert any(not torch.equal(after_one[n], p) for n, p in adapter.items() if "lora_A" in n)


def test_the_kl_reference_is_the_base_model_with_the_adapter_disabled(hf_model, tokenizer):
    trajectories = answer_group(hf_model, tokenizer, [1.0, 0.0, 1.0, 0.0])
    batch = pack_trajectories(trajectories, pad_token_id=tokenizer.pad_token_id)
    trainer = _lora_trainer(hf_model, tokenizer, kl_coef=0.1)
    assert trainer.reference is None  # no second copy of the weights
    first, second = trainer.train_step(trajectories).as_metrics(), trainer.train_step(trajectories).as_metrics()
    assert first["kl"] == 0.0 and second["kl"] > 0
    with torch.no_grad():
        base = response_logprobs(hf_model, batch)
        assert torch.equal(trainer.reference_logprobs(batch), base)
        policy = response_logprobs(adapter_model(trainer.module), batch)
        assert not torch.equal(policy, base)  # the adapter is on again after the reference's forward


def test_a_lora_checkpoint_restores_adapter_and_optimizer_so_the_next_step_is_the_same(tiny, tokenizer, tmp_path):
    """What the loop saves (the adapter, through the peft model's `save_pretrained`, and the trainer state) and
    restores (`restore_weights`): a trainer built fresh, with another random A, takes the same next step."""
    first, second = answer_group(tiny, tokenizer, [1.0, 0.0, 1.0]), answer_group(tiny, tokenizer, [0.0, 1.0, 1.0], offset=5)
    torch.manual_seed(0)
    uninterrupted = _lora_trainer(tiny, tokenizer)
    uninterrupted.train_step(first)
    state = {"trainer": uninterrupted.state_dict()}
    folder = save_checkpoint(tmp_path / "step_1", uninterrupted.module, tokenizer, state)
    assert (folder / ADAPTER_WEIGHTS).is_file() and (folder / ADAPTER_CONFIG).is_file()
    assert not (folder / "model.safetensors").exists()  # the base is not saved again
    uninterrupted.train_step(second)

    torch.manual_seed(1)
    resumed = _lora_trainer(tiny, tokenizer)
    assert weights_digest(resumed.module) != weights_digest(uninterrupted.module)
    restore_weights(resumed, folder, load_state(folder))
    assert resumed.steps_done == 1
    resumed.train_step(second)
    assert weights_digest(resumed.module) == weights_digest(uninterrupted.module)


def test_merge_writes_a_plain_model_whose_logits_are_the_adapted_models(tiny, tokenizer, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    trainer = _lora_trainer(tiny, tokenizer)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.module.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)  # a trained adapter's B is not 0
    adapter = trainer.save_adapter(tmp_path / "adapter")
    assert main(["merge", "--adapter", str(adapter), "--out", str(tmp_path / "merged"), "--dtype", "float32"]) == 0
    assert "merged model written to" in capsys.readouterr().out
    merged_dir = tmp_path / "merged"
    assert (merged_dir / "model.safetensors").is_file() and not (merged_dir / ADAPTER_CONFIG).exists()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode("There are 10 apples and 3 are eaten.")])
    with torch.no_grad():
        expected = adapter_model(trainer.module).eval()(ids).logits
        assert not torch.allclose(expected, tiny(ids).logits, atol=1e-3)  # the adapter does change the model
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-5, atol=1e-5)
    assert main(["merge", "--adapter", str(adapter), "--out", str(merged_dir)]) == 2
    assert "already holds a model" in capsys.readouterr().err
    assert main(["merge", "--adapter", str(merged_dir), "--out", str(tmp_path / "other")]) == 2
    assert "not a LoRA adapter" in capsys.readouterr().err


def test_sft_with_lora_writes_the_merged_model_and_the_adapter(tmp_path, tiny):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentic_rl.data import SHARED_DATA
    from agentic_rl.loop.sft import SFTConfig, run_sft

    if not (SHARED_DATA / "gsm8k_train.jsonl").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    out = tmp_path / "sft"
    config = SFTConfig(model="tiny-random-smollm2", traces=6, steps=3, batch_size=2, micro_batch_size=2, lr=1e-2,
                       lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]}, output_dir=str(out))  # fmt: skip
    manifest = run_sft(config)
    assert manifest["config"]["lora"]["rank"] == 4 and manifest["last_loss"] == manifest["last_loss"]  # not NaN
    assert (out / "adapter" / ADAPTER_WEIGHTS).is_file()
    assert json.loads((out / "adapter" / ADAPTER_CONFIG).read_text())["r"] == 4
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    changed = {n for n, p in merged.named_parameters() if not torch.equal(p, dict(tiny.named_parameters())[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)
    adapted = PeftModel.from_pretrained(copy.deepcopy(tiny), str(out / "adapter")).eval()
    ids = torch.arange(5, 25).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=1e-5, atol=1e-5)


# ---- the training loop (needs an engine that loads adapters) -----------------------------------------------------


def _engine_loads_adapters() -> bool:
    from agentic_rl.engine.vllm_engine import VLLMEngine

    return hasattr(VLLMEngine, "update_adapter")


@pytest.mark.slow
@pytest.mark.skipif(not _engine_loads_adapters(), reason="VLLMEngine has no update_adapter (LoRA serving) yet")
def test_lora_training_resumed_from_a_checkpoint_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    """A 2-step LoRA run, and a copy of it cut back to its step 1 checkpoint and resumed: the adapter, optimizer and
    weight version come back and the engine serves the checkpoint's adapter, so step 2 repeats bit for bit."""
    import time

    from support.processes import cli_command, run

    from agentic_rl.loop.weight_sync import TMPFS

    started = time.time()
    settings = {"steps": 2, "checkpoint_every": 1, "keep_checkpoints": 2,
                "optimizer": {"lr": 1.0e-3, "micro_batch_size": 3, "lora": {"rank": 4}}}  # fmt: skip
    reference = write_train_config(tmp_path / "reference", **settings).parent / "run"
    run(cli_command("train", "--config", str(reference.parent / "train.yaml"), "--no-progress"))
    for name in ("step_1", "step_2", "final"):
        assert (reference / "checkpoints" / name / ADAPTER_WEIGHTS).is_file()
        assert not (reference / "checkpoints" / name / "model.safetensors").exists()
    cut = tmp_path / "cut"
    shutil.copytree(reference, cut)
    for name in ("step_2", "final"):
        shutil.rmtree(cut / "checkpoints" / name)
    (cut / "weights_rank0.sha256").unlink()
    run(cli_command("train", "--resume", str(cut), "--no-progress"))
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert (cut / "weights_rank0.sha256").read_text() == (reference / "weights_rank0.sha256").read_text()
    left = [p for p in TMPFS.glob("agentic-rl-lora-*") if p.stat().st_mtime >= started]
    assert not left  # each run removed its adapter folders


def test_adapter_folders_of_a_run_whose_process_is_gone_are_removed_by_the_next_run(tmp_path):
    import subprocess
    import sys

    from agentic_rl.loop.weight_sync import FOLDER_PREFIX, remove_orphaned_folders

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    orphan = tmp_path / f"{FOLDER_PREFIX}{gone}-abc"
    live = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-def"
    other = tmp_path / "someone-elses-folder"
    for folder in (orphan, live, other):
        (folder / "version_3").mkdir(parents=True)
    assert remove_orphaned_folders(tmp_path) == [orphan]
    assert not orphan.exists() and live.is_dir() and other.is_dir()
