"""The messages `VLLMEngine` sends from the event loop to its engine thread, one class per kind.

The engine thread takes them from a `queue.SimpleQueue` in the order they were put, between two engine steps
(`agentic_rl.engine.engine_thread` handles each kind). Results travel back on the `concurrent.futures.Future` a
message carries.

Every kind but `Call` changes what the engine holds, so a tensor-parallel group's leader sends each of them to its
followers (`agentic_rl.engine.tensor_parallel`) without its future, callback or weights (`wire`), and each follower
replays it on its own shard of the engine. A `Call` runs on the leader's shard only: it must only read.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.engine.base import Generation

__all__ = [
    "AddRequest",
    "Abort",
    "Call",
    "Command",
    "LoadAdapter",
    "SetPaused",
    "Sleep",
    "Stop",
    "UpdateWeights",
    "WakeUp",
    "wire",
]


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
    result: concurrent.futures.Future[Generation] | None
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

    folder: Path | None
    result: concurrent.futures.Future[tuple[int, float]] | None


@dataclass(frozen=True, slots=True)
class UpdateWeights:
    """Load new full weights as the next weight version (`VLLMEngine.update_weights`), between two engine steps.

    Attributes:
        source: `(name, tensor)` pairs in Hugging Face naming, read one at a time on the engine thread (each may be
            gathered from a sharded trainer as it is read: read to its end even when loading fails).
        reload: load through vLLM's `reload_weights` instead of the in-place copy (`weight_copy.load_weights`).
        result: resolved with `(seconds spent loading, how it loaded)`, or failed with what loading raised.
    """

    source: Iterator[tuple[str, Any]] | None
    reload: bool
    result: concurrent.futures.Future[tuple[float, str]] | None


@dataclass(frozen=True, slots=True)
class SetPaused:
    """Stop (True) or restart (False) the engine steps; requests keep their tokens and KV cache meanwhile.

    Attributes:
        paused: the new `EngineThread.paused`.
        result: resolved with None once set.
    """

    paused: bool
    result: concurrent.futures.Future[None] | None


@dataclass(frozen=True, slots=True)
class Sleep:
    """Free the engine's accelerator memory (vLLM's `LLM.sleep(level)`).

    Attributes:
        level: 1 offloads the weights and drops the KV cache; 2 drops both.
        result: resolved with None once asleep.
    """

    level: int
    result: concurrent.futures.Future[None] | None


@dataclass(frozen=True, slots=True)
class WakeUp:
    """Reallocate what `Sleep` freed (vLLM's `LLM.wake_up(tags)`).

    Attributes:
        tags: None for everything, or `["weights"]` / `["kv_cache"]`.
        result: resolved with None once awake.
    """

    tags: list[str] | None
    result: concurrent.futures.Future[None] | None


@dataclass(frozen=True, slots=True)
class Stop:
    """End the engine thread: requests still pending fail with `EngineError`; later messages are not read."""


#: Any message the engine thread reads.
Command = AddRequest | Abort | Call | LoadAdapter | SetPaused | Sleep | Stop | UpdateWeights | WakeUp

#: The fields a follower of a tensor-parallel group fills in itself: futures, callbacks and weights stay local.
_LOCAL_FIELDS = ("result", "deliver", "source", "folder")


def wire(command: Command) -> Command:
    """`command` as a group's leader sends it to its followers: picklable, its local fields (`_LOCAL_FIELDS`) None.

    Raises:
        TypeError: for a `Call`, which is never replayed (it may hold any function).
    """
    if isinstance(command, Call):
        raise TypeError("a Call runs on the leader's shard only and is never sent to a follower")
    local = {name: None for name in _LOCAL_FIELDS if hasattr(command, name)}
    return dataclasses.replace(command, **local) if local else command
