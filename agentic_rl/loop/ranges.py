"""Ranges that span the sections of a training config: limits the engine or a library puts on the options a user
writes, checked when the config is read, so that an error names the option the user wrote, never an engine
option the run set for them.

The ranges of single options live on their fields (`TrainConfig`, its sections, `SamplingConfig`, `GRPOConfig`,
`LoRAConfig`); every float option of a `Config` is finite. This module holds the ones between options:

| options | range | why |
|---|---|---|
| `optimizer.lora.rank` | <= 512 | the engine serves adapters up to vLLM's largest `max_lora_rank` (`engine.adapters`) |
| `rollout.max_prompt_length + rollout.max_response_length` | <= the engine window | a trajectory's budget fits the window (`engine.max_model_len`, default `VLLMEngineConfig`'s) |
| `rollout.sampling.min_tokens` | <= `rollout.max_response_length` | a first turn can sample that many |
| `rollout.sampling.logprobs` | <= 20 | vLLM's default `max_logprobs`, which the run's engine keeps |
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_LOGPROBS", "check_ranges", "engine_window"]

#: The most top logprobs per position a request of the run's engine may ask for (vLLM's default `max_logprobs`).
MAX_LOGPROBS = 20


def engine_window(config: Any) -> int:
    """The engine window in tokens of the training config `config` (a `TrainConfig`): `engine.max_model_len`, else
    `VLLMEngineConfig`'s default."""
    from agentic_rl.engine.vllm_engine import VLLMEngineConfig

    return config.engine.max_model_len or VLLMEngineConfig.model_fields["max_model_len"].default


def check_ranges(config: Any) -> None:
    """Refuse options of the training config `config` (a `TrainConfig`, which calls this once its sections are
    valid) that are each in range but out of range together (the table above).

    Raises:
        ValueError: naming the options as the config writes them, their values and the limit (the config turns it
            into a `ConfigError`).
    """
    from agentic_rl.engine.adapters import MAX_LORA_RANKS

    rollout = config.rollout
    lora = config.optimizer.lora
    if lora is not None and lora.rank > max(MAX_LORA_RANKS):
        raise ValueError(
            f"optimizer.lora.rank={lora.rank} exceeds {max(MAX_LORA_RANKS)}, the largest LoRA rank the engine "
            "(vLLM max_lora_rank) serves"
        )
    window = engine_window(config)
    budget = rollout.max_prompt_length + rollout.max_response_length
    if budget > window:
        given = "engine.max_model_len" if config.engine.max_model_len else "the engine's default window"
        raise ValueError(
            f"rollout.max_prompt_length + rollout.max_response_length = {rollout.max_prompt_length} + "
            f"{rollout.max_response_length} = {budget} exceeds {given} ({window} tokens): lower them or set "
            f"engine.max_model_len >= {budget}"
        )
    sampling = rollout.sampling
    if sampling.min_tokens > rollout.max_response_length:
        raise ValueError(
            f"rollout.sampling.min_tokens={sampling.min_tokens} exceeds rollout.max_response_length="
            f"{rollout.max_response_length}: no turn could sample that many tokens"
        )
    if sampling.logprobs is not None and sampling.logprobs > MAX_LOGPROBS:
        raise ValueError(
            f"rollout.sampling.logprobs={sampling.logprobs} exceeds {MAX_LOGPROBS}, the most top logprobs per "
            "token the engine reports (vLLM max_logprobs)"
        )
