"""Supervised fine-tuning: masked NLL on the GRPO packing, a trainer that learns, and derived registry models."""

from __future__ import annotations

import json

import pytest
import torch
from support import derived_builders

from agentic_rl import models
from agentic_rl.errors import ConfigError, ModelError
from agentic_rl.models import register_model, resolve_model
from agentic_rl.train.sft import SFTTrainer, masked_nll
from agentic_rl.types import Trajectory


def test_masked_nll_counts_only_trained_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -100.0, -0.25]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    nll, tokens = masked_nll(logprobs, mask)
    assert float(nll) == pytest.approx(1.0 + 3.0 + 0.5) and float(tokens) == 3.0  # the -100 is context only


def _trajectories(tokenizer, n=4):
    rows = []
    for i in range(n):
        prompt = tokenizer.encode(f"<|im_start|>user\nWhat is {i} + {i}?<|im_end|>\n<|im_start|>assistant\n")
        answer = tokenizer.encode(f"It is {2 * i}.<|im_end|>")
        glue = tokenizer.encode("\n<|im_start|>tool\nok<|im_end|>\n")
        rows.append(Trajectory(prompt_tokens=prompt, response_tokens=answer + glue,
                               response_masks=[1] * len(answer) + [0] * len(glue), idx=i))  # fmt: skip
    return rows


def test_sft_trainer_lowers_the_masked_loss_of_its_batch(tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)
    trainer = SFTTrainer(model, pad_token_id=tokenizer.pad_token_id, lr=3e-3, micro_batch_size=2, bf16_autocast=False)
    batch = _trajectories(tokenizer)
    before = trainer.evaluate(batch)
    first = trainer.train_step(batch)
    for _ in range(3):
        last = trainer.train_step(batch)
    assert first["loss"] == pytest.approx(before, rel=1e-4)  # the step's loss is the batch NLL before the update
    assert first["tokens"] == sum(t.num_generated_tokens for t in batch)
    assert last["loss"] < first["loss"] and trainer.evaluate(batch) < before
    assert trainer.steps_done == 4 and all(torch.isfinite(p).all() for p in model.parameters())


def test_sft_trainer_refuses_a_batch_without_trained_tokens(tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)
    trainer = SFTTrainer(model, pad_token_id=tokenizer.pad_token_id, bf16_autocast=False)
    observation_only = Trajectory(prompt_tokens=[1, 2], response_tokens=[3, 4], response_masks=[0, 0])
    with pytest.raises(ConfigError, match="no trajectory with trained tokens"):
        trainer.train_step([observation_only])
    with pytest.raises(ConfigError, match="lr > 0"):
        SFTTrainer(model, pad_token_id=0, lr=0.0)


def test_a_derived_model_is_built_once_and_rebuilt_when_its_recipe_changes(tmp_path, monkeypatch, model_dir):
    monkeypatch.setattr(models, "DERIVED", dict(models.DERIVED))  # registrations end with the test
    base = models.DEFAULT_MODEL
    fingerprint = derived_builders.fingerprint
    register_model("copy-model", base=base, build=derived_builders.copy_build, fingerprint=fingerprint, description="")
    derived_builders.BUILDS.clear()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / models.DEFAULT_MODEL).symlink_to(model_dir)  # the base, already built
    first = resolve_model("copy-model", cache_dir=cache)
    again = resolve_model("copy-model", cache_dir=cache)
    assert first == again == cache / "copy-model" and len(derived_builders.BUILDS) == 1
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["copied_from"] == str(cache / models.DEFAULT_MODEL) and manifest["fingerprint"]["version"] == 1
    assert (first / "config.json").is_file()
    monkeypatch.setitem(derived_builders.VERSION, "value", 2)
    resolve_model("copy-model", cache_dir=cache)
    assert len(derived_builders.BUILDS) == 2  # a changed recipe rebuilds
    failing = derived_builders.failing_build
    register_model("broken-model", base=base, build=failing, fingerprint=fingerprint, description="")
    with pytest.raises(ModelError, match="building broken-model failed: RuntimeError: the recipe broke"):
        resolve_model("broken-model", cache_dir=cache)
    assert not (cache / "broken-model").exists()


def test_research_traces_come_from_the_second_half_and_need_the_rollouts_system_prompt(tokenizer, tmp_path):
    from agentic_rl.data import SHARED_DATA, iter_jsonl
    from agentic_rl.loop.sft import SFTConfig, synthesize_traces, tool_model_fingerprint

    data = SHARED_DATA / "hotpotqa_dev_distractor_500.jsonl"
    if not data.is_file():
        pytest.skip(f"shared data not found at {data}")
    with pytest.raises(ValueError, match="research_system_prompt_file"):
        SFTConfig(research_traces=4)
    with pytest.raises(ValueError, match="nothing to train on"):
        SFTConfig(traces=0)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Research the question; answer in <answer></answer>.\n")
    config = SFTConfig(traces=6, research_traces=4, research_data=str(data), research_system_prompt_file=str(prompt))
    kept, counts = synthesize_traces(config, tokenizer)
    rows = [row for _, row in iter_jsonl(data)]
    held_out = {row["id"] for row in rows[: len(rows) // 2]}
    research = [t for t in kept if t.task["id"] in {row["id"] for row in rows}]
    assert len(kept) == 10 and len(research) == 4 and not held_out & {t.task["id"] for t in research}
    assert counts["kept"] == 6 and counts["research"]["kept"] == 4 and counts["research"]["alignment_mismatches"] == 0
    assert all(t.chat_completions[0]["content"].startswith(prompt.read_text()) for t in research)
    assert synthesize_traces(config, tokenizer)[0][0].task == kept[0].task  # seeded mix
    with pytest.raises(ConfigError, match="research_system_prompt_file"):
        synthesize_traces(config.model_copy(update={"research_system_prompt_file": str(tmp_path / "none.txt")}),
                          tokenizer)  # fmt: skip
    # the research tools read `corpus`: one with a single unrelated document leaves no research trace to keep
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "x", "title": "Unrelated", "text": "Nothing about the questions."}) + "\n")
    assert synthesize_traces(config.model_copy(update={"corpus": str(corpus)}), tokenizer)[1]["research"]["kept"] == 0
    # the registry model's recipe has no research traces, and its fingerprint does not name the research options
    assert not {"research_data", "research_traces", "research_system_prompt_file", "corpus"} & set(
        tool_model_fingerprint(tmp_path)["config"])


# ------------------------------------------------------------------------------------------------ progress

_LINE = r"{label}: step {step}/{total}, loss \d+\.\d{{3}}, \d+:\d\d:\d\d spent, \d+:\d\d:\d\d left"


def _quiet_console():
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=False)


def test_sft_on_the_tiny_model_reports_step_loss_and_time_left_as_log_lines_off_a_terminal(tmp_path, caplog):
    import logging
    import re

    from agentic_rl.data import SHARED_DATA
    from agentic_rl.loop.sft import SFTConfig, run_sft
    from agentic_rl.train.sft import SFTProgress

    if not (SHARED_DATA / "gsm8k_train.jsonl").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    config = SFTConfig(model="tiny-random-smollm2", traces=6, steps=3, batch_size=2, micro_batch_size=2,
                       output_dir=str(tmp_path / "sft"))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="agentic_rl"):
        with SFTProgress(config.steps, "sft", console=_quiet_console(), every=2) as progress:
            manifest = run_sft(config, on_step=progress)
    assert len(progress.lines) == 2  # step 2 (every 2 steps) and the last step
    for line, step in zip(progress.lines, (2, 3), strict=True):
        assert re.fullmatch(_LINE.format(label="sft", step=step, total=3), line), line
    assert progress.lines[-1].startswith(f"sft: step 3/3, loss {manifest['last_loss']:.3f}, ")
    assert progress.lines[-1].endswith(" 0:00:00 left")
    logged = [r.getMessage() for r in caplog.records]
    assert [m for m in logged if m.startswith("sft: step ")] == progress.lines  # through the log, not stdout
    built = r"\d traces built in \d+ s \(\d held out\); fine-tuning tiny-random-smollm2: 2 traces per step, 3 steps"
    assert any(re.match(built, m) for m in logged), logged


def test_sft_progress_draws_a_bar_with_step_loss_and_time_left_on_a_terminal(caplog):
    import io
    import logging

    from rich.console import Console

    from agentic_rl.train.sft import SFTProgress

    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    with caplog.at_level(logging.INFO, logger="agentic_rl"):
        with SFTProgress(4, "fine-tuning", console=console) as progress:
            for step in range(1, 5):
                progress({"step": step, "loss": 2.5 / step})
    screen = console.file.getvalue()
    assert "fine-tuning" in screen and "step" in screen and "4/4" in screen and "loss 0.625" in screen
    assert "left" in screen and "0:00:00" in screen
    assert progress.lines == [] and not caplog.records  # a bar, no log lines
    with SFTProgress(4, "x", console=console, bar=False, every=10) as plain:  # --no-progress: lines, no bar
        for step in range(1, 5):
            plain({"step": step, "loss": 1.0})
    assert [line.split(",")[0] for line in plain.lines] == ["x: step 4/4"]
    from rich.progress import Progress

    with Progress(console=console):  # another bar is showing (a training run that builds the tool model)
        with SFTProgress(2, "nested", console=console, every=1) as nested:
            for step in (1, 2):
                nested({"step": step, "loss": 1.0})
    assert [line.split(",")[0] for line in nested.lines] == ["nested: step 1/2", "nested: step 2/2"]


def test_building_the_tool_model_reports_its_steps(tmp_path, monkeypatch, caplog):
    import logging

    from agentic_rl.loop import sft
    from agentic_rl.train.sft import SFTProgress

    seen = {}

    def fake_run_sft(config, *, output_dir, on_step):
        seen["on_step"] = on_step
        for step in range(1, config.steps + 1):
            on_step({"step": step, "loss": 1.0 / step})
        return {"steps": config.steps}

    monkeypatch.setattr(sft, "run_sft", fake_run_sft)
    with caplog.at_level(logging.INFO, logger="agentic_rl"):
        assert sft.build_tool_model(tmp_path / "base", tmp_path / "out") == {"steps": sft.SFTConfig().steps}
    assert isinstance(seen["on_step"], SFTProgress)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fine-tuning for tool calls: step")]
    if seen["on_step"].console.is_terminal:
        pytest.skip("stderr is a terminal here: the bar is drawn instead of lines")
    total = sft.SFTConfig().steps
    every = max(1, total // 10)  # a line every tenth of the run, and one at its last step
    assert len(lines) == total // every + (total % every != 0)
    assert lines[-1].startswith(f"fine-tuning for tool calls: step {total}/{total}, loss {1.0 / total:.3f}, ")


async def test_traces_are_synthesized_from_inside_an_event_loop(tokenizer):
    """`agentic-rl train` builds a missing tool model on first use, from async code: the replay that records the
    traces runs its own event loop, which must not clash with the caller's."""
    from agentic_rl.loop.sft import SFTConfig, synthesize_traces

    kept, counts = synthesize_traces(SFTConfig(traces=3), tokenizer)
    assert len(kept) == counts["kept"] == 3 and counts["alignment_mismatches"] == 0


def test_bf16_autocast_auto_follows_the_cpus_native_bf16_and_the_fingerprint_records_the_choice(monkeypatch, tmp_path):
    from agentic_rl.loop.sft import SFTConfig, tool_model_fingerprint
    from ascend import device

    for flags, expected in (({"avx2", "fma"}, False), ({"avx512f", "avx512_bf16"}, True), ({"amx_bf16"}, True),
                            ({"asimd", "bf16"}, True)):  # fmt: skip
        monkeypatch.setattr(device, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert SFTConfig().bf16_autocast is expected, flags
        assert SFTConfig(bf16_autocast="auto").bf16_autocast is expected
        assert SFTConfig(bf16_autocast=not expected).bf16_autocast is (not expected)  # an explicit choice wins
        assert tool_model_fingerprint(tmp_path)["config"]["bf16_autocast"] is expected  # each build names its own
    with pytest.raises(ConfigError, match="bf16_autocast"):
        SFTConfig(bf16_autocast="sometimes")
    assert SFTConfig(bf16_autocast=" Auto").bf16_autocast is SFTConfig().bf16_autocast  # any case


def test_the_package_finds_the_checkouts_files_it_builds_models_and_tools_from(tmp_path):
    """The paths a module computes from its own place in the checkout (moved modules once pointed inside the
    package): the research SFT recipe, with its system prompt and data, the shared data and the search corpus."""
    from agentic_rl.data import SHARED_DATA
    from agentic_rl.loop.sft import RESEARCH_SFT_CONFIG, research_model_fingerprint
    from agentic_rl.tools.corpus import DEFAULT_CORPUS_PATH

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    assert RESEARCH_SFT_CONFIG.is_file() and RESEARCH_SFT_CONFIG.parent.name == "examples"
    assert DEFAULT_CORPUS_PATH.is_file()
    fingerprint = research_model_fingerprint(tmp_path)  # reads the recipe, its prompt file and the data it names
    assert fingerprint["sources"] and all(len(digest) == 64 for digest in fingerprint["sources"].values())
