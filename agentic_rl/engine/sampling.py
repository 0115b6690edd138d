"""`SamplingConfig`: the typed sampling options of one engine request (a subset of `vllm.SamplingParams`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from agentic_rl.config import Config

__all__ = ["SamplingConfig", "derive_seed", "fold_seed"]

_Float = Annotated[float, Field(allow_inf_nan=False)]

_SEED_MODULUS = 2**31 - 1


def fold_seed(seed: int) -> int:
    """Any integer seed folded into the engine's seed range, [0, 2**31 - 2]: `seed mod (2**31 - 1)`.

    Seeds already in that range are unchanged. Clients send seeds of any width (OpenAI clients often 64-bit ones);
    vLLM reads -1 as "unseeded", and torch refuses seeds beyond 64 bits: folding keeps each request seeded and
    reproducible whatever integer it came with.
    """
    return seed % _SEED_MODULUS


def derive_seed(
    seed: int, *, rank: int = 0, step: int = 0, trajectory: int = 0, turn: int = 0, choice: int = 0, attempt: int = 0
) -> int:
    """The seed of one engine request, derived from a run's base seed: the one rule every caller follows.

    Each coordinate moves the seed by its own stride, so the samples of a group (trajectories of one task), of the
    turns of a trajectory, of the ranks and of the training steps all differ, and a resumed run draws what the
    uninterrupted one would have.

    Args:
        seed: the base seed (a config's `seed`).
        rank: the data-parallel rank (stride 1,000).
        step: the training step, 0-based (stride 7,368,787).
        trajectory: the trajectory's index in its batch (stride 1,000,003).
        turn: the turn's index in its trajectory (stride 7,919).
        choice: the choice of an `n > 1` server request (stride 1).
        attempt: the attempt of a trajectory rolled out again after an infrastructure failure, 0 for the first
            (stride 104,729): a retry draws a fresh sample.

    Returns:
        `seed` itself at the origin (all coordinates 0); else `(seed + offset) mod (2**31 - 1)`, in [0, 2**31 - 2].
    """
    offset = 1000 * rank + 7_368_787 * step + 1_000_003 * trajectory + 7_919 * turn + choice + 104_729 * attempt
    if offset == 0:  # the first request of a run samples with the run's own seed
        return seed
    return (seed + offset) % _SEED_MODULUS


class SamplingConfig(Config):
    """Sampling options of one request; names and meanings are `vllm.SamplingParams`'s. One sample per request.

    Attributes:
        max_tokens: most tokens to sample, >= 1; None lets the caller decide (the rollout uses what is left of the
            window and the response budget, and always clamps a given value to it).
        min_tokens: sample at least this many tokens before a stop may end the request, >= 0 and <= `max_tokens`
            when that is given (the rollout clamps it with `max_tokens` to the room a turn has).
        temperature: >= 0; 0 is greedy.
        top_p: nucleus mass in (0, 1].
        top_k: sample from the k most likely tokens; 0 or -1 = off.
        min_p: drop tokens below `min_p` x the most likely token's probability, in [0, 1].
        presence_penalty, frequency_penalty: OpenAI-style penalties in [-2, 2].
        repetition_penalty: > 0; 1 = off.
        seed: per-request seed (the rollout offsets it per trajectory and turn); None = unseeded. Any integer is
            taken and folded into the engine's range (`fold_seed`).
        stop: strings that end the request (the match is not part of the output text).
        stop_token_ids: token ids that end the request (the id is the last sampled token).
        logit_bias: `{token_id: bias}` added to those tokens' logits before sampling, each bias in [-100, 100].
        logprobs: how many most-likely tokens to report per position besides the sampled one; None or 0 = only the
            sampled token's logprob (always recorded).
        detokenize: let the engine build output text (None: only when `stop` strings need it).
        structured_outputs: a `vllm.sampling_params.StructuredOutputsParams` constraining the output (regex,
            JSON schema, grammar), or None.

    Raises:
        ConfigError: naming an unknown option or a value out of range (e.g. `SamplingConfig.max_token is not a
            known field`).
    """

    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    temperature: Annotated[_Float, Field(ge=0.0)] = 1.0
    top_p: Annotated[_Float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=-1)] = 0
    min_p: Annotated[_Float, Field(ge=0.0, le=1.0)] = 0.0
    presence_penalty: Annotated[_Float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[_Float, Field(ge=-2.0, le=2.0)] = 0.0
    repetition_penalty: Annotated[_Float, Field(gt=0.0)] = 1.0
    seed: StrictInt | None = None
    stop: list[StrictStr] | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    logit_bias: dict[Annotated[StrictInt, Field(ge=0)], Annotated[_Float, Field(ge=-100.0, le=100.0)]] | None = None
    logprobs: Annotated[StrictInt, Field(ge=0)] | None = None
    detokenize: StrictBool | None = None
    structured_outputs: Any = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("seed")
    @classmethod
    def _engine_seed(cls, value: int | None) -> int | None:
        return None if value is None else fold_seed(value)

    @model_validator(mode="after")
    def _min_tokens_within_max_tokens(self) -> SamplingConfig:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens} exceeds max_tokens={self.max_tokens}: a request cannot sample more "
                "than its most tokens"
            )
        return self

    @classmethod
    def of(cls, sampling: SamplingConfig | Mapping[str, Any] | None) -> SamplingConfig:
        """`sampling` itself, or a `SamplingConfig` built from a mapping of options (None = all defaults).

        Raises:
            ConfigError: for an unknown option, a bad value, or something that is neither.
        """
        if isinstance(sampling, SamplingConfig):
            return sampling
        if sampling is None:
            return cls()
        if not isinstance(sampling, Mapping):
            from agentic_rl.errors import ConfigError

            raise ConfigError(f"sampling must be a SamplingConfig or a dict of options, got {type(sampling).__name__}")
        return cls.model_validate(dict(sampling))

    def derived(self, **coordinates: int) -> SamplingConfig:
        """A copy whose `seed` is `derive_seed(seed, **coordinates)`; itself when unseeded."""
        if self.seed is None:
            return self
        return self.model_copy(update={"seed": derive_seed(self.seed, **coordinates)})

    def vllm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `vllm.SamplingParams`: every option that is set (None values left out)."""
        return {name: value for name, value in self if value is not None}

    def engine_kwargs(self) -> dict[str, Any]:
        """`vllm_kwargs()` with the engine's own defaults, decided here once: `detokenize` only when `stop` strings
        need the text, and `logprobs` 0 (the sampled token's logprob is always recorded)."""
        kwargs = self.vllm_kwargs()
        kwargs.setdefault("detokenize", bool(self.stop))
        kwargs.setdefault("logprobs", 0)
        return kwargs
