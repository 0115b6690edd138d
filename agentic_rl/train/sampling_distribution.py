"""The distribution an engine sampled a token from (`SamplingDistribution`): the rollout's temperature, top-k and
top-p, which the trainer's logprobs follow (`train.logprobs.sampling_logprobs`). It imports no torch, so that a
config's sampling is checked without loading the trainer."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = ["SamplingDistribution"]


#: Sampling options that change the distribution in ways `SamplingDistribution` does not model, with their neutral
#: values (vLLM applies them before the temperature: logit bias, penalties; or after it: min-p).
_UNMODELED = {
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
}


@dataclass(frozen=True, slots=True)
class SamplingDistribution:
    """The distribution a token was sampled from: softmax(logits / temperature), kept to the top-k tokens, then to
    the top-p nucleus, and renormalized (vLLM's order: `Sampler.sample`, then `apply_top_k_top_p`).

    Attributes:
        temperature: > 0 (greedy sampling, temperature 0, has no distribution to train on).
        top_k: keep the tokens whose tempered logit is at least the k-th largest (ties with it all kept); 0 or -1 =
            off, and a k of at least the vocabulary keeps every token.
        top_p: nucleus mass in (0, 1]: going up from the least likely token (after top-k), every token is dropped
            while the cumulative probability up to and including it is <= 1 - top_p; the token that crosses it, and
            always the most likely token, are kept (vLLM's `apply_top_k_top_p_pytorch`). 1 = off.

    Raises:
        ConfigError: for a temperature that is not a finite number > 0, a `top_k` below -1 or a `top_p` outside
            (0, 1].
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"SamplingDistribution.temperature must be a finite number > 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ConfigError(f"SamplingDistribution.top_k must be an int >= -1 (0 or -1: off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"SamplingDistribution.top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_plain(self) -> bool:
        """Whether this is the model's own softmax (temperature 1, no top-k, no top-p): `token_logprobs` exactly."""
        return self.temperature == 1.0 and self.top_k <= 0 and self.top_p == 1.0

    @classmethod
    def of(cls, sampling: Mapping[str, Any] | Any) -> SamplingDistribution:
        """The distribution of requests sampled with `sampling`: a mapping or an object (the engine's
        `SamplingConfig`) with `temperature`, `top_k`, `top_p` (each optional, vLLM's defaults 1, 0, 1).

        Raises:
            ConfigError: for options this distribution does not model set to a non-neutral value (`min_p`, the
                presence / frequency / repetition penalties, `logit_bias`), or for a value `SamplingDistribution`
                rejects (temperature 0 included).
        """
        get = sampling.get if isinstance(sampling, Mapping) else lambda name, default: getattr(sampling, name, default)
        unmodeled = [name for name, neutral in _UNMODELED.items() if get(name, neutral) not in (neutral, {})]
        if unmodeled:
            raise ConfigError(
                f"sampling options {unmodeled} change the distribution in ways the trainer's logprobs "
                "do not reproduce; only temperature, top_k and top_p are modeled"
            )
        return cls(
            temperature=float(get("temperature", 1.0)), top_k=int(get("top_k", 0)), top_p=float(get("top_p", 1.0))
        )
