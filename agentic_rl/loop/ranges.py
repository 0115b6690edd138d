"""Ranges that span the sections of a training config: limits the engine or a library puts on the options a user
writes, checked when the config is read, so that an error names the option the user wrote, never an engine
option the run set for them.

The ranges of single options live on their fields (`TrainConfig`, its sections, `SamplingConfig`, `GRPOConfig`,
`LoRAConfig`); every float option of a `Config` is finite. This module holds the ones between options:

| options | range | why |
|---|---|---|
| `optimizer.lora.rank` | <= 512 | the engine serves adapters up to vLLM's largest `max_lora_rank` (`engine.adapters`) |
| `rollout.max_prompt_length + rollout.max_response_length` | <= `engine.max_model_len` | a trajectory's budget fits the engine window |
| `engine.max_model_len`, else that budget | <= the model's `max_position_embeddings` | the window the model was trained for (`check_model_window`, once the model is resolved) |
| `rollout.sampling.min_tokens` | <= `rollout.max_response_length` | a first turn can sample that many |
| `rollout.sampling.logprobs` | <= 20 | vLLM's default `max_logprobs`, which the run's engine keeps |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = ["MAX_LOGPROBS", "check_model_window", "check_ranges", "engine_window"]

#: The most top logprobs per position a request of the run's engine may ask for (vLLM's default `max_logprobs`).
MAX_LOGPROBS = 20


def engine_window(config: Any) -> int:
    """The engine window in tokens of the training config `config` (a `TrainConfig`): `engine.max_model_len`, else
    the trajectory budget `rollout.max_prompt_length + rollout.max_response_length` (what the run's engine gets,
    `rollout.agent.start_engine`)."""
    rollout = config.rollout
    return config.engine.max_model_len or rollout.max_prompt_length + rollout.max_response_length


def check_model_window(config: Any, model_dir: str | Path) -> None:
    """Refuse an engine window (`engine_window`) longer than the model's `max_position_embeddings` (read from
    `model_dir/config.json`; a model that does not give one is not checked), before any engine starts.

    Raises:
        ConfigError: naming `engine.max_model_len` (or the rollout lengths that make the window), the model and its
            window.
    """
    from transformers import AutoConfig

    limit = getattr(AutoConfig.from_pretrained(str(model_dir)), "max_position_embeddings", None)
    window = engine_window(config)
    if not isinstance(limit, int) or window <= limit:
        return
    given = (
        f"engine.max_model_len={window}"
        if config.engine.max_model_len
        else f"rollout.max_prompt_length + rollout.max_response_length = {window}"
    )
    raise ConfigError(
        f"{given} exceeds the window of model {config.model!r} (max_position_embeddings={limit} in {model_dir}): "
        "lower it"
    )


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
    budget = rollout.max_prompt_length + rollout.max_response_length
    if config.engine.max_model_len and budget > config.engine.max_model_len:
        raise ValueError(
            f"rollout.max_prompt_length + rollout.max_response_length = {rollout.max_prompt_length} + "
            f"{rollout.max_response_length} = {budget} exceeds engine.max_model_len={config.engine.max_model_len}: "
            f"lower them or raise engine.max_model_len to {budget}"
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
