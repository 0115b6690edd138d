"""The engine interface the rollout talks to: prompt token ids + sampling options in, sampled ids out."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from agentic_rl.engine.sampling import SamplingConfig

__all__ = [
    "AdapterEngine",
    "Engine",
    "EngineDtype",
    "Generation",
    "PausableEngine",
    "StreamingEngine",
    "TrainableEngine",
    "sampled_versions",
]


#: The weight and activation dtypes an engine takes (vLLM's names; `auto`: the model folder's).
EngineDtype = Literal["bfloat16", "float16", "float32", "half", "float", "auto"]


@dataclass(frozen=True, slots=True)
class Generation:
    """What one generate call returned.

    Attributes:
        token_ids: the sampled token ids, including the stop token when the engine stopped on one.
        logprobs: log-probability (nats) of each sampled token under the engine, same length as `token_ids`.
        finish_reason: `stop` (a stop token id, the end-of-sequence token or a stop string), `length` (hit
            `max_tokens` or the model window), `abort`, or vLLM's `error` / `repetition`; "" on the items of a
            stream (`VLLMEngine.stream`) before its last. `agentic_rl.engine.turns` reads what that makes of an
            assistant turn.
        stop_reason: the stop token id or stop string that ended generation, None for an end-of-sequence token.
        top_logprobs: per position, the engine's most likely tokens `{token_id: logprob}`, when requested with
            `sampling.logprobs = k > 0`; otherwise None.
        weight_versions: per token id, the engine `weight_version` whose forward pass sampled it (a request in
            flight across a weight update has the old version on its first tokens and the new one after); None
            from an engine that does not track it, whose tokens count as sampled at the version read when the
            request was sent (`sampled_versions`).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | str | None = None
    top_logprobs: list[dict[int, float]] | None = None
    weight_versions: list[int] | None = None


def sampled_versions(generation: Generation, sent_version: int) -> list[int]:
    """The weight version of each of `generation`'s tokens: its own `weight_versions`, or `sent_version` (the
    engine's `weight_version` when the request was sent) for every token when the engine did not set them."""
    if generation.weight_versions is not None:
        return list(generation.weight_versions)
    return [sent_version] * len(generation.token_ids)


@runtime_checkable
class Engine(Protocol):
    """Token-in/token-out generation. Implementations must be safe to call from many tasks at once."""

    @property
    def max_model_len(self) -> int:
        """Model window in tokens (prompt + response)."""
        ...

    @property
    def weight_version(self) -> int:
        """How many weight updates the engine has taken (0 = the weights it started with); stamped on each turn."""
        ...

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        """Sample one continuation of `prompt_ids`.

        Args:
            prompt_ids: the full prompt as token ids.
            sampling: the request's sampling options (`max_tokens`, `temperature`, `seed`, `stop_token_ids`...).

        Raises:
            EngineError: if the engine is not running or the request fails.
        """
        ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An `Engine` that can also hand out the sampled tokens while it samples them."""

    def stream(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncIterator[Generation]:
        """Yield the tokens of one continuation as they are sampled: each item holds the new tokens only, and every
        item but the last has `finish_reason == ""`. Closing the iterator early aborts the request.

        Raises:
            EngineError: if the engine is not running or the request fails.
        """
        ...


@runtime_checkable
class TrainableEngine(Engine, Protocol):
    """An `Engine` that a training loop owns: new weights go in between steps, memory is freed while training."""

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> float:
        """Load `(name, tensor)` pairs (Hugging Face names) in place; requests in flight continue on the new weights.

        Afterwards no cached prefix computed with the old weights is reused and `weight_version` is one higher.

        Returns:
            Seconds spent loading.

        Raises:
            EngineError: if the engine rejects the weights.
        """
        ...

    async def sleep(self, level: int = 1) -> bool:
        """Free accelerator memory while the trainer runs; False (a no-op) where the engine cannot sleep."""
        ...

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Reallocate what `sleep` freed (`tags`: `["weights"]`, then `["kv_cache"]`); False where a no-op."""
        ...

    async def close(self) -> None:
        """Stop the engine; requests still in flight fail with `EngineError`. Idempotent."""
        ...


@runtime_checkable
class PausableEngine(TrainableEngine, Protocol):
    """A `TrainableEngine` whose generation can pause while the trainer steps (`rollout.placement: pause`)."""

    async def pause_generation(self) -> None:
        """Stop sampling until `resume_generation`: requests in flight keep their tokens and KV cache, new requests
        are accepted and wait, and `update_weights` still works (the tokens sampled after resuming carry the new
        `weight_version`). Idempotent.

        Raises:
            EngineError: if the engine is not running.
        """
        ...

    async def resume_generation(self) -> None:
        """Sample again after `pause_generation`: paused and waiting requests continue. Idempotent (a no-op when
        not paused).

        Raises:
            EngineError: if the engine is not running.
        """
        ...


@runtime_checkable
class AdapterEngine(TrainableEngine, Protocol):
    """A `TrainableEngine` that can serve LoRA adapters on frozen base weights: a sync sends only the adapter."""

    @property
    def lora_enabled(self) -> bool:
        """True when the engine serves adapters: sync with `update_adapter`, not `update_weights`."""
        ...

    async def update_adapter(self, folder: str | os.PathLike[str]) -> None:
        """Load the peft adapter saved in `folder` as weight version `weight_version + 1`; requests sent afterwards
        use it, requests in flight finish on the adapter they started with (their tokens keep its version).

        Raises:
            EngineError: if LoRA is off, the folder holds no valid adapter, or the engine refuses it.
        """
        ...
