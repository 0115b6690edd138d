"""The options of the in-process vLLM engine (`VLLMEngineConfig`) and the `vllm.LLM` keyword arguments they make.

`llm_kwargs` turns the options into what `vllm.LLM` takes on this machine's platform (`ascend.device`): the KV cache
by bytes on the CPU, by share of the card on an accelerator, plus the platform's own arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator

from agentic_rl.config import Config
from agentic_rl.engine.adapters import MAX_LORA_RANKS
from agentic_rl.engine.base import EngineDtype
from agentic_rl.engine.load_log import verbose

__all__ = ["VLLMEngineConfig", "llm_kwargs", "on_accelerator"]


def _platform_dtype() -> str:
    from ascend.device import current_platform

    return current_platform().engine_dtype


class VLLMEngineConfig(Config):
    """Options for building the in-process vLLM engine.

    Attributes:
        model: path of a local Hugging Face model folder.
        dtype: weight and activation dtype (`bfloat16`, `float32`, `auto`: the model folder's). Default: the
            platform's (`ascend.device.Platform.engine_dtype`): `bfloat16` on accelerators and on CPUs with native
            bf16 instructions, else `float32`.
        max_model_len: model window in tokens (prompt + response).
        kv_cache_gib: KV-cache size in GiB on the CPU (vLLM's `kv_cache_memory_bytes`); ignored on accelerators,
            which use `gpu_memory_utilization`.
        gpu_memory_utilization: fraction of accelerator memory vLLM may take.
        enforce_eager: skip torch.compile / graph capture (faster start-up, ~10% lower throughput).
        seed: engine seed.
        max_num_seqs: most sequences batched in one engine step.
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes (every turn re-sends its history).
        block_size: KV-cache block size in tokens (None: the platform's; 32 on the CPU). Prefix caching reuses whole
            blocks only, so each turn's continuation recomputes the history's last, partial block: with vLLM's CPU
            default of 128 that was ~80 tokens per continuation (a multi-turn rollout prefilled 31% more tokens
            than the same work in one request); 32 is the smallest block vLLM's CPU backend took here.
        logprobs_mode: which distribution the recorded logprob of each sampled token is of (vLLM's
            `logprobs_mode`; its names `raw_logprobs` / `processed_logprobs` are taken too). `raw`: the model's own
            softmax, before anything `SamplingConfig` changes. `processed`: the distribution the token was sampled
            from, as vLLM 0.32's `Sampler` builds it, in this order: allowed-token and bad-word masks, `min_tokens`
            (stop tokens masked until then) and `logit_bias`, the repetition / frequency / presence penalties,
            the temperature, `min_p`, then top-k and top-p (renormalized over the tokens they keep). The trainer
            reproduces the temperature, top-k and top-p (`train.logprobs.SamplingDistribution`, `GRPOTrainer`'s
            `sampling`), not the rest. A greedy request (temperature 0) reports log softmax of the penalized
            logits. vLLM's FlashInfer and ROCm samplers cannot report processed logprobs; vLLM falls back to its
            PyTorch sampler on those GPUs.
        enable_sleep_mode: let `sleep()` free engine memory while training (GPU/NPU only; ignored on the CPU).
        weight_version: the `weight_version` of the weights in `model` (a resumed training run starts its engine from
            a checkpoint that many updates in).
        weight_sync: how `update_weights` loads: `in_place` copies into the model's parameters and re-packs only
            layers served from a packed copy, where vLLM's CPU backend allows it (else, and with `reload`, vLLM's
            `reload_weights`, which re-processes every layer).
        max_lora_rank: None (default): no LoRA, `update_weights` syncs full weights. An int (one of vLLM's sizes
            `adapters.MAX_LORA_RANKS`): the engine serves peft LoRA adapters of rank up to it on frozen base weights,
            each sync sends only the adapter (`VLLMEngine.update_adapter`), and `update_weights` is refused.
        max_loras: with `max_lora_rank`, the most LoRA adapters the engine holds: the latest and those requests in
            flight still sample with (see `agentic_rl.engine.adapters`); with bounded staleness, `max_staleness + 1`.
        engine_kwargs: any further `vllm.LLM` keyword arguments (not LoRA's: use `max_lora_rank` / `max_loras`).
    """

    model: str | Path
    dtype: EngineDtype = Field(default_factory=_platform_dtype)
    max_model_len: Annotated[int, Field(ge=16)] = 4096
    kv_cache_gib: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    enforce_eager: bool = True
    seed: int = 0
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    enable_prefix_caching: bool = True
    block_size: Annotated[int, Field(ge=1)] | None = None
    logprobs_mode: Literal["raw", "processed"] = "raw"
    enable_sleep_mode: bool = False
    weight_version: Annotated[int, Field(ge=0)] = 0
    weight_sync: Literal["in_place", "reload"] = "in_place"
    max_lora_rank: StrictInt | None = None
    max_loras: Annotated[StrictInt, Field(ge=1)] = 1
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_lora_rank(cls, value: int | None) -> int | None:
        if value is not None and value not in MAX_LORA_RANKS:
            raise ValueError(f"must be one of vLLM's LoRA ranks {MAX_LORA_RANKS} (or null: no LoRA)")
        return value

    @field_validator("engine_kwargs")
    @classmethod
    def _no_lora_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        lora = sorted(key for key in value if "lora" in key)
        if lora:
            raise ValueError(f"LoRA options {lora} are set by max_lora_rank and max_loras, not engine_kwargs")
        parallel = sorted(key for key in value if key in ("tensor_parallel_size", "distributed_executor_backend"))
        if parallel:
            raise ValueError(
                f"{parallel} are set by the engine's tensor-parallel group (VLLMEngine(config, group=...); in a "
                "training run engine.tensor_parallel_size), not engine_kwargs"
            )
        other = sorted(key for key in value if key in ("pipeline_parallel_size", "data_parallel_size"))
        if other:
            raise ValueError(
                f"{other}: an in-process engine is one process, or one tensor-parallel group of torchrun ranks "
                "(engine.tensor_parallel_size); pipeline and data parallelism inside the engine are not supported"
            )
        return value

    @field_validator("logprobs_mode", mode="before")
    @classmethod
    def _vllm_logprobs_mode_name(cls, value: Any) -> Any:
        names = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
        return names.get(value, value) if isinstance(value, str) else value


#: KV block size on the CPU, so that a turn's continuation recomputes at most 31 tokens of history the prefix cache
#: cannot hold (vLLM's CPU default is 128). vLLM 0.32's CPU attention backend wants a multiple of 32 for its default
#: kernel and refused 16 here ("No common block size for 16").
_CPU_BLOCK_SIZE = 32


def on_accelerator() -> bool:
    from ascend.device import current_platform

    return current_platform().is_accelerator


def llm_kwargs(config: VLLMEngineConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": str(config.model),
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "enforce_eager": config.enforce_eager,
        "seed": config.seed,
        "max_num_seqs": config.max_num_seqs,
        "enable_prefix_caching": config.enable_prefix_caching,
        "logprobs_mode": f"{config.logprobs_mode}_logprobs",
        "use_tqdm_on_load": verbose(),  # its weight-loading bar, between the caller's own progress lines
    }
    from ascend.device import current_platform

    platform = current_platform()
    if platform.is_accelerator:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = config.enable_sleep_mode
        kwargs.update(platform.engine_kwargs())
    else:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gib * (1 << 30))
        # A seeded request whose prompt is split across engine steps (chunked prefill, once a batch's prompts
        # exceed the step's token budget) makes vLLM rewind its generator, which torch's CPU generators cannot
        # do: the step raises "CPU Generator does not use offset" and every request in flight fails.
        kwargs["enable_chunked_prefill"] = False
        kwargs["block_size"] = _CPU_BLOCK_SIZE
    if config.block_size is not None:
        kwargs["block_size"] = config.block_size
    if config.max_lora_rank is not None:
        # One more adapter in vLLM's CPU-side cache than in use, so that a new adapter loads (and is checked)
        # before the unused old one is removed, and vLLM never evicts one a request in flight still samples with.
        kwargs.update(
            enable_lora=True,
            max_lora_rank=config.max_lora_rank,
            max_loras=config.max_loras,
            max_cpu_loras=config.max_loras + 1,
        )
    kwargs.update(config.engine_kwargs)
    return kwargs
