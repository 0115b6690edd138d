"""Engine calls of a prepared request: its `n` choices sampled whole or as streams of deltas.

The engine's failures become what the client is told: a request the engine rejects (`EngineRejectedError`, e.g.
sampling options or a constraint it cannot honour) is a 400 `RequestError` naming the constraint's field; a
request the engine ends with finish_reason `error` under a constraint is a 400 too, else an `EngineError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio

from agentic_rl.engine.base import Engine, Generation, StreamingEngine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import EngineError, EngineRejectedError, RequestError
from agentic_rl.server.prepare import PreparedCall

__all__ = ["choice_deltas", "choice_sampling", "engine_failure", "failed_request", "generate_choices"]


def choice_sampling(call: PreparedCall, i: int) -> SamplingConfig:
    """The sampling options of choice `i`: with `n > 1` and a seed, each choice gets its own (`derive_seed`)."""
    if call.request.n > 1:
        return call.sampling.derived(choice=i)
    return call.sampling


def engine_failure(call: PreparedCall, exc: EngineError) -> Exception:
    """The error to raise for an engine error: a rejected request is a 400 `RequestError`, others stay as they are."""
    if isinstance(exc, EngineRejectedError):
        return RequestError(str(exc), param=call.constraint.param)
    return exc


def failed_request(call: PreparedCall) -> Exception:
    """The error for a request the engine ended with finish_reason `error` (no turn was sampled)."""
    if call.constraint.param is not None:  # e.g. a grammar the engine could not compile
        return RequestError(
            f"the engine could not sample under the constraint from '{call.constraint.param}' "
            "(e.g. a recursive schema with no finite value)",
            param=call.constraint.param,
        )
    return EngineError("the engine ended the request with an error")


async def generate_choices(engine: Engine, call: PreparedCall) -> list[Generation]:
    """Sample the call's `n` choices at once.

    Returns:
        One whole generation per choice, in choice order.

    Raises:
        RequestError: if the engine rejects the request, or fails it under an output constraint (400).
        EngineError: if the engine fails otherwise.
    """
    results: list[Generation | None] = [None] * call.request.n

    async def one(i: int) -> None:
        results[i] = await engine.generate(call.prompt_ids, choice_sampling(call, i))

    try:
        async with anyio.create_task_group() as tg:
            for i in range(call.request.n):
                tg.start_soon(one, i)
    except* EngineError as group:
        raise engine_failure(call, group.exceptions[0]) from None
    for r in results:
        if r is not None and r.finish_reason == "error":
            raise failed_request(call)
    return [r for r in results if r is not None]


async def choice_deltas(engine: Engine, call: PreparedCall, i: int) -> AsyncIterator[Generation]:
    """The deltas of choice `i` as the engine samples them; an engine that cannot stream gives one whole delta."""
    sampling = choice_sampling(call, i)
    if isinstance(engine, StreamingEngine):
        async for delta in engine.stream(call.prompt_ids, sampling):
            yield delta
    else:
        yield await engine.generate(call.prompt_ids, sampling)
