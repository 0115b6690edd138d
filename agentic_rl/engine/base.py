"""The engine interface the rollout talks to: prompt token ids + sampling options in, sampled ids out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Engine", "Generation"]


@dataclass(frozen=True, slots=True)
class Generation:
    """What one generate call returned.

    Attributes:
        token_ids: the sampled token ids, including the stop token when the engine stopped on one.
        logprobs: log-probability (nats) of each sampled token under the engine, same length as `token_ids`.
        finish_reason: `stop` (end-of-turn token or stop string), `length` (hit `max_tokens`) or `abort`.
        stop_reason: the stop token id or stop string that ended generation, None for an end-of-sequence token.
        top_logprobs: per position, the engine's most likely tokens `{token_id: logprob}`, when requested with
            `sampling["logprobs"] = k > 0`; otherwise None.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | str | None = None
    top_logprobs: list[dict[int, float]] | None = None


@runtime_checkable
class Engine(Protocol):
    """Token-in/token-out generation. Implementations must be safe to call from many tasks at once."""

    @property
    def max_model_len(self) -> int:
        """Model window in tokens (prompt + response)."""
        ...

    async def generate(self, prompt_ids: Sequence[int], sampling: Mapping[str, Any]) -> Generation:
        """Sample a continuation of `prompt_ids`.

        Args:
            prompt_ids: the full prompt as token ids.
            sampling: sampling options (`max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop_token_ids`...).

        Raises:
            EngineError: if the engine is not running or the request fails.
        """
        ...
