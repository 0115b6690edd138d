"""The messages `VLLMEngine` sends from the event loop to its engine thread, one class per kind.

The engine thread takes them from a `queue.SimpleQueue` in the order they were put, between two engine steps
(`agentic_rl.engine.engine_thread` handles each kind). Results travel back on the `concurrent.futures.Future` a
message carries.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.engine.base import Generation

__all__ = ["AddRequest", "Abort", "Call", "Command", "LoadAdapter", "Stop"]


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Start sampling a continuation of a prompt.

    Attributes:
        request_id: the engine's id of the request, unique per engine.
        prompt_ids: the full prompt as token ids.
        sampling: `vllm.SamplingParams` keyword arguments (`SamplingConfig.engine_kwargs()`, which decides the
            defaults of `detokenize` and `logprobs`).
        result: resolved with the whole `Generation` when the request finishes, or failed with `EngineError`
            (`EngineRejectedError` when vLLM refuses the request); a future cancelled before the engine thread
            takes the message drops the request.
        deliver: for a streamed request, called on the engine thread with each `Generation` of the tokens sampled
            since the previous call; None for a request answered only at its end.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: dict[str, Any]
    result: concurrent.futures.Future[Generation]
    deliver: Callable[[Generation], None] | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    """Drop a request: abort it in vLLM, or release it if it is still held back. Unknown ids are ignored.

    Attributes:
        request_id: the `AddRequest.request_id` of the request.
    """

    request_id: str


@dataclass(frozen=True, slots=True)
class Call:
    """Run a function on the engine between two engine steps (weight update, sleep, wake-up, any `VLLMEngine.call`).

    Attributes:
        fn: called with the `vllm.LLM`.
        result: resolved with what `fn` returned, or failed with what it raised; a future cancelled before the
            engine thread takes the message skips the call.
    """

    fn: Callable[[Any], Any]
    result: concurrent.futures.Future[Any]


@dataclass(frozen=True, slots=True)
class LoadAdapter:
    """Load a LoRA adapter as the next weight version (`agentic_rl.engine.adapters`).

    Attributes:
        folder: the checked, absolute path of the peft adapter folder.
        result: resolved with `(version, seconds spent loading)`, or failed with `EngineError`; a future cancelled
            before the engine thread loads the adapter (e.g. while the sync waits for a free slot) skips the load.
    """

    folder: Path
    result: concurrent.futures.Future[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Stop:
    """End the engine thread: requests still pending fail with `EngineError`; later messages are not read."""


#: Any message the engine thread reads.
Command = AddRequest | Abort | Call | LoadAdapter | Stop
