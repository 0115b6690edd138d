"""Cold-start supervised fine-tuning for tool use, and the `smollm2-135m-tools` model it builds.

`run_sft(config)` synthesizes calculator traces from GSM8K's annotated solutions and, when asked, research traces
(`search`/`visit`) from HotpotQA's supporting facts (`rollout.traces`), records them through the real turn loop with
the same chat renderer, system prompt and tool schema the rollout uses, and trains
the masked NLL of the tokens the policy writes (`train.sft`, on the same packing as the GRPO step). The result is a
Hugging Face folder (weights, tokenizer) with a `manifest.json` (base model, data digest, config, trace counts,
losses).

Importing this module registers `smollm2-135m-tools` in the model registry (`models.register_model`): the registry
builds it with `build_tool_model` the first time it is asked for, and rebuilds it when `tool_model_fingerprint` (base
model, data digest, recipe) no longer matches its manifest; likewise `smollm2-135m-research` (the tool model, then
`examples/sft_research.yaml`) with `build_research_model`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from agentic_rl.config import Config, Weight
from agentic_rl.data import SHARED_DATA, iter_jsonl
from agentic_rl.errors import ConfigError
from agentic_rl.models import DEFAULT_MODEL, file_sha256, register_model
from agentic_rl.train.grpo_config import LoRAConfig

__all__ = [
    "RESEARCH_MODEL",
    "RESEARCH_SFT_CONFIG",
    "SFTConfig",
    "TOOL_MODEL",
    "build_research_model",
    "build_tool_model",
    "register_derived_models",
    "research_model_fingerprint",
    "run_sft",
    "synthesize_traces",
    "tool_model_fingerprint",
]

logger = logging.getLogger(__name__)

#: Most synthesized traces held out of training to measure the NLL before and after; a third of them when there are
#: fewer than 48 (so `examples/sft_research.yaml`'s 48 traces keep the 16 its measured run held out).
HELD_OUT_TRACES = 16

#: Bump when the recipe changes in a way the config does not show (forces cached tool models to rebuild).
RECIPE_VERSION = 4

#: The registry names of the models this recipe builds (registered at the end of the module).
TOOL_MODEL = "smollm2-135m-tools"
RESEARCH_MODEL = "smollm2-135m-research"


class SFTConfig(Config):
    """A supervised fine-tuning run on synthesized tool-use traces (`agentic-rl sft --config FILE`).

    Attributes:
        model: base model (registry name, local folder or hub id).
        data: GSM8K-format JSON Lines (`{"question", "answer"}` with `<<expr=value>>` annotations).
        traces: how many calculator traces to synthesize (0: none).
        max_calls: most calculator calls in one trace.
        call_weights: relative shares of traces with 1, 2, ... `max_calls` calls (`max_calls` numbers). The default
            favours one call (4:2:1): GSM8K's own mix (mostly 2-4 calls) teaches a model to keep calling after the
            call that answered, so that it rarely states a result.
        research_data: HotpotQA-format JSON Lines (the shared `hotpotqa_dev_distractor_500.jsonl` layout). Traces
            come from its second half only (rows `n // 2` onward): the first half is the held-out set, so that
            `agentic-rl rollout --data FILE --limit K` (K <= n // 2) evaluates questions never trained on.
        research_traces: how many research traces (`search` the question, `visit` the supporting documents, answer
            in `<answer></answer>`) to synthesize (0: none).
        research_system_prompt_file: the system prompt the research rollout will use (its `--system-prompt-file`);
            required with research traces, so that the trained tokens are the ones that rollout sees.
        corpus: `{id, title, text}` JSON Lines file of the `search`/`visit` tools the research traces call (the
            rollout's `--corpus`; default: the shared HotpotQA corpus). Paths are relative to the working
            directory, as in every config.
        steps: optimizer steps; each takes `batch_size` traces, cycling through them in a seeded order.
        batch_size: traces per optimizer step.
        micro_batch_size: traces per forward/backward.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping norm.
        bf16_autocast: compute in bfloat16 (weights stay fp32): `true`, `false`, or `"auto"` (the default), which
            becomes `true` where the CPU multiplies bf16 natively (`avx512_bf16`, `amx_bf16`, Arm `bf16`) and `false`
            elsewhere, when the config is built. Measured on 2-core x86 VMs with SmolLM2-135M: with AMX bf16 the
            tool-model recipe took 116-134 s instead of 262 s in fp32, to the same held-out NLL (0.813 vs 0.807) and
            rollout (tool-call rate 1.0, 0 alignment mismatches); without native bf16 a forward under autocast ran
            4-14x slower than in fp32.
        seed: seeds trace selection, batch order and torch.
        output_dir: where the model folder, `manifest.json` and `metrics.jsonl` are written.
        lora: train a LoRA adapter on the frozen base instead of every weight (`train.lora.LoRAConfig`); the model
            folder then holds the merged model (what the rollout serves) and `adapter/` the adapter itself.
    """

    model: str = DEFAULT_MODEL
    data: str = str(SHARED_DATA / "gsm8k_train.jsonl")
    traces: Annotated[int, Field(ge=0)] = 256
    max_calls: Annotated[int, Field(ge=1, le=9)] = 3
    call_weights: list[Weight] = [4.0, 2.0, 1.0]
    research_data: str = str(SHARED_DATA / "hotpotqa_dev_distractor_500.jsonl")
    research_traces: Annotated[int, Field(ge=0)] = 0
    research_system_prompt_file: str | None = None
    corpus: str | None = None
    steps: Annotated[int, Field(ge=1)] = 24
    batch_size: Annotated[int, Field(ge=1)] = 8
    micro_batch_size: Annotated[int, Field(ge=1)] = 8
    lr: Annotated[float, Field(gt=0)] = 1.5e-4
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    bf16_autocast: bool | Literal["auto"] = Field(default="auto", validate_default=True)
    seed: int = 0
    output_dir: str = "runs/sft"
    lora: LoRAConfig | None = None

    @field_validator("bf16_autocast", mode="before")
    @classmethod
    def _auto_is_native_bf16(cls, value: Any) -> Any:
        """`"auto"` (any case) becomes whether the CPU has native bf16; anything else is validated as a bool."""
        if isinstance(value, str) and value.strip().lower() == "auto":
            from ascend.device import native_cpu_bf16

            return native_cpu_bf16()
        return value

    @model_validator(mode="after")
    def _weights_per_call_count(self) -> SFTConfig:
        if len(self.call_weights) != self.max_calls or sum(self.call_weights) <= 0:
            raise ValueError(
                f"call_weights needs max_calls={self.max_calls} numbers with a positive sum, got {self.call_weights}"
            )
        if self.traces + self.research_traces < 1:
            raise ValueError("traces and research_traces are both 0: nothing to train on")
        if self.research_traces and not self.research_system_prompt_file:
            raise ValueError(
                "research_traces needs research_system_prompt_file: the system prompt of the rollout "
                "that will use the model (e.g. examples/deep_research/system_prompt.txt)"
            )
        return self


def synthesize_traces(config: SFTConfig, tokenizer: Any) -> tuple[list[Any], dict[str, Any]]:
    """Calculator and research traces recorded through the real turn loop, as the rollout would record them.

    Returns:
        The kept `StepTrajectory` records (one family, or both in a seeded mixed order) and their counts (`kept`,
        `dropped_*`, `alignment_mismatches`, `calls` histogram of tool calls per trace; `research`: the same counts
        for the research traces).

    Raises:
        ConfigError: if no trace survives, or the research system prompt file cannot be read.
    """
    from agentic_rl.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer)
    kept: list[Any] = []
    counts: dict[str, Any] = {}
    if config.traces:
        kept, counts = _calculator_traces(config, renderer)
    if config.research_traces:
        research, counts["research"] = _research_traces(config, renderer)
        kept = [*kept, *research]
        if config.traces:
            random.Random(config.seed).shuffle(kept)
    if not kept:
        files = [f for f, n in ((config.data, config.traces), (config.research_data, config.research_traces)) if n]
        raise ConfigError(f"no usable trace from {' and '.join(files)}: {counts}")
    return kept, counts


def _replayed(
    traces: list[Any], renderer: Any, environment: Any, max_steps: int, reward_fn: Any
) -> tuple[list[Any], dict[str, Any]]:
    import anyio

    from agentic_rl.rollout.spec import HarnessConfig
    from agentic_rl.rollout.traces import replay_traces

    harness = HarnessConfig(
        max_steps=max_steps, max_prompt_length=4096, max_response_length=4096, sampling={"max_tokens": 2048}
    )
    replay = functools.partial(
        replay_traces, traces, renderer=renderer, environment=environment, config=harness, reward_fn=reward_fn
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        kept, stats = anyio.run(replay)
    else:  # called from async code (a model built on first use inside `train`): its own loop in its own thread
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            kept, stats = pool.submit(anyio.run, replay).result()
    calls: dict[str, int] = {}
    for trajectory in kept:
        key = str(trajectory.metrics.get("steps", 0) - 1)
        calls[key] = calls.get(key, 0) + 1
    counts = {
        "kept": stats.kept,
        "dropped_observation_mismatch": stats.dropped_observation_mismatch,
        "dropped_failed": stats.dropped_failed,
        "dropped_incomplete": stats.dropped_incomplete,
        "alignment_mismatches": sum(t.metrics.get("alignment_mismatches", 0) for t in kept),
        "calls": calls,
    }
    if stats.reasons:
        counts["first_drop_reasons"] = stats.reasons[:3]
    return kept, counts


def _calculator_traces(config: SFTConfig, renderer: Any) -> tuple[list[Any], dict[str, Any]]:
    from agentic_rl.environments.tool_env import ToolEnvironment
    from agentic_rl.parser import tool_call_format
    from agentic_rl.rewards.math import gsm8k_reward
    from agentic_rl.rollout.traces import gsm8k_traces
    from agentic_rl.tools.calculator import CalculatorTool

    rows = [row for _, row in iter_jsonl(config.data)]
    traces = gsm8k_traces(
        rows,
        count=config.traces,
        max_calls=config.max_calls,
        seed=config.seed,
        call_weights=config.call_weights,
        call_format=tool_call_format(renderer.tokenizer.chat_template),  # the calls the template teaches
    )
    environment = ToolEnvironment.for_renderer([CalculatorTool()], renderer)  # as the rollout builds it
    return _replayed(traces, renderer, environment, config.max_calls + 1, gsm8k_reward)


def _research_traces(config: SFTConfig, renderer: Any) -> tuple[list[Any], dict[str, Any]]:
    from agentic_rl.environments.tool_env import ToolEnvironment
    from agentic_rl.parser import tool_call_format
    from agentic_rl.rewards.qa import hotpotqa_f1_reward
    from agentic_rl.rollout.traces import hotpotqa_traces
    from agentic_rl.tools.registry import build_tools

    assert config.research_system_prompt_file is not None  # the config's validator requires it
    try:
        system_prompt = Path(config.research_system_prompt_file).read_text()  # read as the rollout CLI reads it
    except OSError as exc:
        raise ConfigError(f"research_system_prompt_file: {exc}") from exc
    rows = [row for _, row in iter_jsonl(config.research_data)]
    half = len(rows) // 2
    # a row without an id is named by its line number, never by a number a held-out row could have
    second = [{"id": half + i, **row} if isinstance(row, dict) else row for i, row in enumerate(rows[half:])]
    tools = build_tools(["search", "visit"], corpus=config.corpus)  # the order `--tools search,visit` gives
    call_format = tool_call_format(renderer.tokenizer.chat_template)
    traces = hotpotqa_traces(
        second, count=config.research_traces, seed=config.seed, search=tools[0], visit=tools[1], call_format=call_format
    )
    environment = ToolEnvironment.for_renderer(tools, renderer, system_prompt)
    return _replayed(traces, renderer, environment, 8, hotpotqa_f1_reward)


def run_sft(
    config: SFTConfig, *, output_dir: str | Path | None = None, on_step: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Synthesize traces, fine-tune `config.model` on them and save the result.

    Writes to `output_dir` (default `config.output_dir`): the model and tokenizer (`save_pretrained`; with
    `config.lora` the merged model, and the adapter in `adapter/`),
    `metrics.jsonl` (one line per step) and `manifest.json` (base model; the sha256 of each file the traces came
    from: `data` with calculator traces, `research_data` and the research system prompt with research traces;
    config, trace counts, first and last loss, held-out NLL before/after on `min(16, traces // 3)` synthesized traces
    that are not trained on (None with fewer than 3 traces), seconds).

    Returns:
        The manifest.

    Raises:
        ConfigError: before any work, when `output_dir` is a file or holds an earlier run or model
            (`manifest.json`, `metrics.jsonl`, `config.json`, `model.safetensors`); for unusable inputs, before the
            folder is created.
    """
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    t0 = time.perf_counter()
    out = Path(output_dir or config.output_dir)
    _check_output_dir(out)
    base_dir = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    trajectories, counts = synthesize_traces(config, tokenizer)
    out.mkdir(parents=True, exist_ok=True)  # only once the inputs proved usable
    n_held = min(HELD_OUT_TRACES, len(trajectories) // 3)
    held_out, train = trajectories[:n_held], trajectories[n_held:]
    logger.info(
        "%d traces built in %.0f s (%d held out); fine-tuning %s: %d traces per step, %d step%s",
        len(trajectories),
        time.perf_counter() - t0,
        n_held,
        config.model,
        config.batch_size,
        config.steps,
        "" if config.steps == 1 else "s",
    )
    model, trainer = _sft_trainer(config, base_dir, tokenizer)
    held_out_before = trainer.evaluate(held_out) if held_out else None
    history = _train_steps(config, trainer, train, out / "metrics.jsonl", on_step)
    held_out_after = trainer.evaluate(held_out) if held_out else None
    _save_model(config, model, tokenizer, out)
    manifest = {
        "base_model": config.model,
        "base_dir": str(base_dir),
        **_sources(config),
        "config": config.model_dump(),
        "recipe_version": RECIPE_VERSION,
        "traces": counts,
        "trained_traces": len(train),
        "first_loss": history[0]["loss"],
        "last_loss": history[-1]["loss"],
        "held_out_traces": len(held_out),
        "held_out_nll_before": held_out_before,
        "held_out_nll_after": held_out_after,
        "seconds": time.perf_counter() - t0,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    held = f"held-out NLL {held_out_before:.3f} -> {held_out_after:.3f}" if held_out else "no held-out traces"
    logger.info(
        "SFT done in %.0f s: loss %.3f -> %.3f, %s",
        manifest["seconds"],
        manifest["first_loss"],
        manifest["last_loss"],
        held,
    )
    return manifest


def _sft_trainer(config: SFTConfig, base_dir: Path, tokenizer: Any) -> tuple[Any, Any]:
    """The model (seeded; with `config.lora`, wrapped in its adapter layers) and the `SFTTrainer` over it (over the
    adapter layers only, with LoRA)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.train.sft import SFTTrainer

    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    if config.lora is not None:  # the trainer runs the model with its adapter layers in place, and trains only them
        from agentic_rl.train.lora import adapter_model, wrap_model

        model = wrap_model(model, config.lora)
    trainer = SFTTrainer(
        adapter_model(model) if config.lora is not None else model,
        pad_token_id=tokenizer.pad_token_id,
        lr=config.lr,
        weight_decay=config.weight_decay,
        micro_batch_size=config.micro_batch_size,
        max_grad_norm=config.max_grad_norm,
        bf16_autocast=config.bf16_autocast,
    )
    return model, trainer


def _train_steps(
    config: SFTConfig,
    trainer: Any,
    train: list[Any],
    metrics_path: Path,
    on_step: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    """`config.steps` optimizer steps of `config.batch_size` traces each, cycling through `train` in a seeded order;
    each step's row is appended to `metrics_path` and handed to `on_step`. Returns the rows."""
    order = list(range(len(train)))
    rng = random.Random(config.seed)
    rng.shuffle(order)
    history: list[dict[str, Any]] = []
    with metrics_path.open("w", encoding="utf-8") as metrics:
        for step in range(config.steps):
            picks = [order[(step * config.batch_size + i) % len(order)] for i in range(config.batch_size)]
            row = {"step": step + 1, **trainer.train_step([train[i] for i in picks])}
            history.append(row)
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
            if on_step is not None:
                on_step(row)
    return history


def _save_model(config: SFTConfig, model: Any, tokenizer: Any, out: Path) -> None:
    """Save the model and tokenizer into `out`: with LoRA, the adapter into `out/adapter` and the merged model."""
    if config.lora is not None:
        model.save_pretrained(out / "adapter")
        model = model.merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _check_output_dir(out: Path) -> None:
    """Refuse a folder a run cannot write, or one that holds an earlier run (it would be overwritten in part)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} is a file, not a folder")
    earlier = [
        name for name in ("manifest.json", "metrics.jsonl", "config.json", "model.safetensors") if (out / name).exists()
    ]
    if earlier:
        raise ConfigError(
            f"output_dir {out} already holds an earlier run or model ({', '.join(earlier)}): choose "
            "another output_dir, or remove that folder"
        )


def _sources(config: SFTConfig) -> dict[str, Any]:
    """The files the traces were built from, with their sha256."""
    sources: dict[str, Any] = {}
    if config.traces:
        sources |= {"data": config.data, "data_sha256": file_sha256(config.data)}
    if config.research_traces:
        from agentic_rl.tools.corpus import DEFAULT_CORPUS_PATH

        assert config.research_system_prompt_file is not None  # the config's validator requires it
        corpus = DEFAULT_CORPUS_PATH if config.corpus is None else config.corpus
        sources |= {
            "research_data": config.research_data,
            "research_data_sha256": file_sha256(config.research_data),
            "research_system_prompt_file": config.research_system_prompt_file,
            "research_system_prompt_sha256": file_sha256(config.research_system_prompt_file),
            "corpus": str(corpus),
            "corpus_sha256": file_sha256(corpus),
        }
    return sources


def tool_model_fingerprint(base_dir: Path) -> dict[str, Any]:
    """What `smollm2-135m-tools` is built from: the base model's build marker, the data digest and the recipe."""
    config = SFTConfig()
    marker = base_dir / ".agentic_rl_ready"
    return {
        "base": marker.read_text().strip() if marker.is_file() else str(base_dir),
        "data_sha256": file_sha256(config.data),
        "config": config.model_dump(
            exclude={
                "output_dir",
                "data",
                "research_data",
                "research_traces",
                "research_system_prompt_file",
                "corpus",
                "lora",
            }
        ),
        "recipe_version": RECIPE_VERSION,
    }


def build_tool_model(base_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Build `smollm2-135m-tools` into `out_dir`: `run_sft` with the default `SFTConfig` on `base_dir`.

    Shows the steps (step, loss, time left) with `SFTProgress`: a bar on a terminal, a log line every few steps
    elsewhere. Returns the manifest.
    """
    from agentic_rl.train.sft import SFTProgress

    config = SFTConfig(model=str(base_dir))
    logger.warning(
        "building the tool-calling model from %s (supervised fine-tuning, %d steps; once)", base_dir, config.steps
    )
    with SFTProgress(config.steps, "fine-tuning for tool calls") as progress:
        return run_sft(config, output_dir=out_dir, on_step=progress)


#: The recipe of `smollm2-135m-research`: the checkout's research SFT config (its paths relative to the checkout).
RESEARCH_SFT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "sft_research.yaml"


def _research_config(base_dir: Path) -> SFTConfig:
    """`RESEARCH_SFT_CONFIG` on `base_dir`, its system prompt file made absolute.

    Raises:
        ConfigError: if the checkout has no `examples/sft_research.yaml` (e.g. an installed wheel).
    """
    if not RESEARCH_SFT_CONFIG.is_file():
        raise ConfigError(
            f"{RESEARCH_SFT_CONFIG} does not exist: smollm2-135m-research is built from a checkout's "
            "examples/sft_research.yaml (or run 'agentic-rl sft --config FILE' yourself)"
        )
    config = SFTConfig.from_yaml(RESEARCH_SFT_CONFIG)
    prompt = RESEARCH_SFT_CONFIG.parents[1] / str(config.research_system_prompt_file)
    return config.model_copy(update={"model": str(base_dir), "research_system_prompt_file": str(prompt)})


def research_model_fingerprint(base_dir: Path) -> dict[str, Any]:
    """What `smollm2-135m-research` is built from: the base model's build marker, the config, the digests of the
    HotpotQA file, the system prompt and the corpus, and the recipe."""
    config = _research_config(base_dir)
    marker = base_dir / ".agentic_rl_ready"
    return {
        "base": marker.read_text().strip() if marker.is_file() else str(base_dir),
        "sources": {key: value for key, value in _sources(config).items() if key.endswith("sha256")},
        "config": config.model_dump(
            exclude={"model", "output_dir", "data", "research_data", "research_system_prompt_file", "corpus"}
        ),
        "recipe_version": RECIPE_VERSION,
    }


def build_research_model(base_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Build `smollm2-135m-research` into `out_dir`: `run_sft` with `RESEARCH_SFT_CONFIG` on `base_dir` (the tool
    model). Returns the manifest."""
    from agentic_rl.train.sft import SFTProgress

    config = _research_config(base_dir)
    logger.warning(
        "building the research model from %s (supervised fine-tuning on HotpotQA research traces, %d steps; once)",
        base_dir,
        config.steps,
    )
    with SFTProgress(config.steps, "fine-tuning for research") as progress:
        return run_sft(config, output_dir=out_dir, on_step=progress)


def register_derived_models() -> None:
    """Register `smollm2-135m-tools` and `smollm2-135m-research` in the model registry (`models.register_model`), so
    that `resolve_model` builds them on first use. Importing this module (or `agentic_rl.loop`) does it; an entry
    point that may resolve those names calls it to say so (again is harmless: registering replaces)."""
    register_model(
        TOOL_MODEL,
        base=DEFAULT_MODEL,
        build=build_tool_model,
        fingerprint=tool_model_fingerprint,
        description="SmolLM2-135M-Instruct fine-tuned to call a calculator (GSM8K traces), built on first use",
    )
    register_model(
        RESEARCH_MODEL,
        base=TOOL_MODEL,
        build=build_research_model,
        fingerprint=research_model_fingerprint,
        description="the tool model fine-tuned to search and visit (examples/sft_research.yaml: HotpotQA research "
        "traces from the file's second half), built on first use",
    )


register_derived_models()
