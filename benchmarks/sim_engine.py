"""Simulated engines for the harness benchmarks: every request returns the same assistant turn after a simulated delay.

They implement the `agentic_rl.engine.base.Engine` protocol (`max_model_len`, `weight_version`, `generate`), so the
rollout (`run_trajectory`, `ToolAgentEngineWrapper`) and the OpenAI-compatible server (`OpenAIServing`) run on them
unchanged. Their only job is to take the model out of a measurement: what is timed is the harness around them. They
are benchmark instruments, not part of the package (the project's tests sample with the real vLLM engine).

Two timing models:

- `SimulatedEngine`: a turn of n tokens submitted while c requests are in flight (itself included) takes
  `n * (base_s + per_request_s * c)` seconds (`harness_overhead.py`).
- `BatchingEngine`: a continuous-batching engine. One clock of decode steps of `step_s` seconds each is shared by
  every request: a request joins the batch at the next step boundary and gets one token per step, so concurrent
  requests share steps and a step costs the same whatever the batch size. A turn of n tokens takes n steps plus
  the wait for the next boundary. The engine counts the seconds in which at least one request was in the batch
  (`busy_s`). Safe to call from several threads and event loops at once (the server's thread and the caller's).

Both sleep with the event loop's timer, whose resolution (about 1 ms with asyncio and uvloop on Linux) rounds up
delays shorter than that.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from agentic_rl import Generation, SamplingConfig

__all__ = ["BatchingEngine", "SimulatedEngine", "tool_call_turn"]


def tool_call_turn(renderer: Any, name: str = "calculator", arguments: Mapping[str, Any] | None = None) -> list[int]:
    """Token ids of one assistant turn that is a single `<tool_call>` block (the format the tool system prompt teaches
    and `agentic_rl.parser` reads), encoded with `renderer` (a `ChatRenderer`); the end-of-turn id is not included.

    `arguments` default to `{"expression": "6*7"}` (a valid calculator call).
    """
    from agentic_rl.rollout.traces import tool_call_text

    return renderer.encode(tool_call_text(name, {"expression": "6*7"} if arguments is None else arguments))


class _FixedTurnEngine:
    """The generation part: `tokens` then `eot` (the stop token), each with a fixed logprob; subclasses add the wait.

    A request whose `max_tokens` is below the turn's length gets its first `max_tokens` ids and finish_reason
    `length`, as a real engine would; otherwise finish_reason `stop` with `stop_reason = eot`.
    """

    def __init__(self, tokens: Sequence[int], eot: int, *, logprob: float = -0.5, max_model_len: int = 1 << 20) -> None:
        if not tokens:
            raise ValueError("tokens must hold at least one token id")
        if not (math.isfinite(logprob) and logprob <= 0.0):
            raise ValueError(f"logprob must be a finite number <= 0, got {logprob!r}")
        self.tokens, self.eot, self.logprob = list(tokens), eot, logprob
        self._max_model_len = max_model_len
        self.weight_version = 0

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def turn(self, sampling: SamplingConfig) -> Generation:
        """The generation for one request's `sampling` (`max_tokens`, `logprobs` for top logprobs)."""
        ids = [*self.tokens, self.eot]
        stop: int | None = self.eot
        finish = "stop"
        if sampling.max_tokens is not None and sampling.max_tokens < len(ids):
            ids, finish, stop = ids[: sampling.max_tokens], "length", None
        top = [{t: self.logprob} for t in ids] if sampling.logprobs else None
        return Generation(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish, stop_reason=stop,
                          top_logprobs=top)  # fmt: skip

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        generation = self.turn(sampling)
        await self._wait(len(generation.token_ids))
        return generation

    async def _wait(self, n_tokens: int) -> None:
        raise NotImplementedError


class SimulatedEngine(_FixedTurnEngine):
    """A turn of n tokens takes `n * (base_s + per_request_s * in_flight)` seconds (`in_flight`: requests in flight
    when it is submitted, itself included). Use it from one event loop."""

    def __init__(self, tokens: Sequence[int], eot: int, base_s: float = 0.0, per_request_s: float = 0.0) -> None:
        super().__init__(tokens, eot)
        self.base_s, self.per_request_s = base_s, per_request_s
        self.in_flight = 0

    def token_latency(self, concurrency: int) -> float:
        """Seconds per token with `concurrency` requests in flight."""
        return self.base_s + self.per_request_s * concurrency

    async def _wait(self, n_tokens: int) -> None:
        self.in_flight += 1
        try:
            latency = n_tokens * self.token_latency(self.in_flight)
            if latency:
                await anyio.sleep_until(anyio.current_time() + latency)
        finally:
            self.in_flight -= 1


class BatchingEngine(_FixedTurnEngine):
    """A continuous-batching engine with decode steps of `step_s` seconds on one shared clock (see the module).

    Args:
        tokens: the ids of the assistant turn every request returns (e.g. `tool_call_turn(renderer)`).
        eot: the stop token appended to it (the template's end-of-turn id).
        step_s: seconds per decode step, > 0; every request in the batch gets one token per step.
        logprob: the logprob (nats) reported for every sampled token.
        max_model_len: the window the engine reports, in tokens.

    Attributes:
        requests, tokens_sampled: counts since the last `reset_stats`.

    Raises:
        ValueError: for `step_s <= 0`, an empty turn or a logprob that is not a finite number <= 0.
    """

    def __init__(self, tokens: Sequence[int], eot: int, *, step_s: float = 20e-6, logprob: float = -0.5,
                 max_model_len: int = 1 << 20) -> None:  # fmt: skip
        super().__init__(tokens, eot, logprob=logprob, max_model_len=max_model_len)
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s must be a finite number of seconds > 0, got {step_s!r}")
        self.step_s = step_s
        self._origin = time.monotonic()
        self._lock = threading.Lock()
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero `requests`, `tokens_sampled` and `busy_s`."""
        with self._lock:
            self.requests = self.tokens_sampled = self._busy_steps = self._last_step = 0

    @property
    def busy_s(self) -> float:
        """Seconds (of the step clock) in which at least one request was in the batch, since `reset_stats`."""
        return self._busy_steps * self.step_s

    def admit(self, n_tokens: int, now: float) -> float:
        """Put a request of `n_tokens` tokens, arriving at `now` (`time.monotonic()` seconds), in the batch.

        Returns:
            When it finishes (`time.monotonic()` seconds): the end of the `n_tokens`-th step from the next boundary.
        """
        first = math.floor((now - self._origin) / self.step_s) + 1
        last = first + n_tokens
        with self._lock:
            self.requests += 1
            self.tokens_sampled += n_tokens
            self._busy_steps += max(0, last - max(first, self._last_step))
            self._last_step = max(self._last_step, last)
        return self._origin + last * self.step_s

    async def _wait(self, n_tokens: int) -> None:
        done = self.admit(n_tokens, time.monotonic())
        await anyio.sleep(max(0.0, done - time.monotonic()))
