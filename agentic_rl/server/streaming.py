"""Streamed calls: engine deltas turned into OpenAI chunks (`chat.completion.chunk` / `text_completion`).

The `n` choices stream at once, their deltas in arrival order. A running choice sends only text no later token can
change (a stop string or a tool call may still cut it); its last delta sends the rest of the final content, its
tool calls (a head with id and name, then the arguments) and the finish reason. The message is built by the same
`ResponseBuilder` a whole response uses, once per choice: the recorded message is the one streamed, so a streamed
call is recorded exactly like a plain one, tool-call ids included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from agentic_rl.engine.base import Engine, Generation, sampled_versions
from agentic_rl.errors import EngineError
from agentic_rl.server.capture import TrajectoryRecorder
from agentic_rl.server.engine_calls import choice_deltas, engine_failure, failed_request
from agentic_rl.server.prepare import PreparedCall
from agentic_rl.server.responses import ResponseBuilder, finite_logprobs, record_call, token_usage

__all__ = ["ChunkStream", "stream_chunks"]

logger = logging.getLogger(__name__)


class ChunkStream:
    """The chunks of a streamed call; its first chunk is already computed (so errors surface before streaming)."""

    def __init__(self, first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> None:
        self._first: dict[str, Any] | None = first
        self._rest = rest

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        """Stop the call: aborts its engine requests."""
        await self._rest.aclose()  # type: ignore[attr-defined]


class _Choice:
    """One choice's sampled ids as they grow, the text already sent for it, and once it ends, its final text and
    the message sent (the one recorded: its tool-call ids are the ones the client received)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[dict[int, float]] = []
        self.versions: list[int] = []  # the weight version of each id
        self.sent = ""
        self.started = False
        self.final: Generation | None = None
        self.text = ""
        self.message: dict[str, Any] | None = None


async def stream_chunks(
    engine: Engine, call: PreparedCall, responses: ResponseBuilder, recorder: TrajectoryRecorder
) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a streamed call; its n engine streams run at once, their deltas in arrival order.

    Closing this iterator (a client that went away) cancels the engine streams, which aborts their requests. A
    tagged call is recorded once every choice has finished.

    Args:
        engine: the engine to sample from.
        call: the prepared call.
        responses: builds the text, message and logprobs of each chunk.
        recorder: where a call tagged with a trajectory id is recorded.

    Yields:
        OpenAI chunks (the first also carries `prompt_token_ids`); then a usage chunk if the request asks for one.
        A failure after the first chunk is sent ends the stream with an `{"error": ...}` chunk.

    Raises:
        RequestError: if the engine rejects the request before any chunk is sent (400).
        EngineError: if the engine fails before any chunk is sent.
    """
    arrivals: asyncio.Queue[tuple[int, Generation | Exception]] = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for delta in choice_deltas(engine, call, i):
                arrivals.put_nowait((i, delta))
        except Exception as exc:  # reported in order, after the deltas before it
            arrivals.put_nowait((i, exc))

    choices = [_Choice(i) for i in range(call.request.n)]
    pumps = [asyncio.create_task(pump(i)) for i in range(call.request.n)]
    failure: Exception | None = None
    sent_any = False
    try:
        while failure is None and any(c.final is None for c in choices):
            i, item = await arrivals.get()
            if isinstance(item, Exception):
                failure = engine_failure(call, item) if isinstance(item, EngineError) else item
                break
            if item.finish_reason == "error":
                failure = failed_request(call)
                break
            for chunk in _delta_chunks(call, responses, choices[i], item, first=not sent_any):
                sent_any = True
                yield chunk
    finally:
        for task in pumps:
            task.cancel()
    if failure is not None:
        if not sent_any:
            raise failure
        logger.warning("streamed call %s failed: %s", call.id, failure)
        yield {"error": {"message": str(failure), "type": "internal_error", "param": None, "code": 500}}
        return
    if call.request.include_usage:
        yield _chunk(call, responses, [], usage=token_usage(call, [c.ids for c in choices]))
    if call.trajectory_id is not None:
        c = choices[0]
        assert c.final is not None
        whole = Generation(c.ids, c.logprobs, c.final.finish_reason, c.final.stop_reason, weight_versions=c.versions)
        record_call(recorder, call, whole, c.message, c.text)


def _delta_chunks(
    call: PreparedCall, responses: ResponseBuilder, choice: _Choice, delta: Generation, first: bool
) -> list[dict[str, Any]]:
    """The chunks for one engine delta of one choice (the last delta also closes the choice)."""
    choice.ids += delta.token_ids
    choice.logprobs += delta.logprobs
    choice.versions += sampled_versions(delta, call.weight_version)
    if delta.top_logprobs is not None:
        choice.tops += delta.top_logprobs
    extra: dict[str, Any] = {"token_ids": delta.token_ids, "sampled_logprobs": finite_logprobs(delta.logprobs)}
    tops = delta.top_logprobs
    if call.chat:
        logprobs = responses.chat_logprobs(call, delta.token_ids, delta.logprobs, tops)
    else:
        logprobs = responses.completion_logprobs(call, delta.token_ids, delta.logprobs, tops, offset=len(choice.sent))
    if delta.finish_reason == "":
        text = responses.visible_text(call, choice.ids)
        new = text[len(choice.sent) :] if text.startswith(choice.sent) else ""
        choice.sent += new
        pieces = [_piece(call, choice, content=new)]
    else:
        pieces = _closing_pieces(call, responses, choice, delta)
    pieces[0].update(logprobs=logprobs, **extra)
    chunks = [_chunk(call, responses, [piece]) for piece in pieces]
    if first:
        chunks[0]["prompt_token_ids"] = call.prompt_ids
    return chunks


def _closing_pieces(
    call: PreparedCall, responses: ResponseBuilder, choice: _Choice, delta: Generation
) -> list[dict[str, Any]]:
    """The choice parts that close a choice: the rest of its content, its tool calls, its finish reason."""
    choice.final = delta
    text = choice.text = responses.final_text(choice.ids, delta.finish_reason, delta.stop_reason)
    if call.chat:
        message, finish = responses.message(call, text, delta.finish_reason)
        content = message["content"] or ""
    else:
        message, finish, content = None, delta.finish_reason, text
    choice.message = message
    if not content.startswith(choice.sent):  # cannot happen if visible_text only ever grows
        logger.warning("streamed text of %s diverged from the final text", call.id)
    new = content[len(choice.sent) :] if content.startswith(choice.sent) else ""
    choice.sent += new
    pieces: list[dict[str, Any]] = []
    if new or not message or not message.get("tool_calls"):
        pieces.append(_piece(call, choice, content=new))
    for j, tool_call in enumerate((message or {}).get("tool_calls") or []):
        head = {
            "index": j,
            "id": tool_call["id"],
            "type": "function",
            "function": {"name": tool_call["function"]["name"], "arguments": ""},
        }
        pieces.append(_piece(call, choice, tool_calls=[head]))
        arguments = {"index": j, "function": {"arguments": tool_call["function"]["arguments"]}}
        pieces.append(_piece(call, choice, tool_calls=[arguments]))
    pieces.append(
        {
            "index": choice.index,
            **({"delta": {}} if call.chat else {"text": ""}),
            "finish_reason": finish,
            "logprobs": None,
        }
    )
    return pieces


def _piece(
    call: PreparedCall, choice: _Choice, *, content: str = "", tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One choice part of a chunk; a chat choice's first one carries `role`."""
    if not call.chat:
        return {"index": choice.index, "text": content, "logprobs": None, "finish_reason": None}
    delta: dict[str, Any] = {}
    if not choice.started:
        delta["role"] = "assistant"
        choice.started = True
    if content:
        delta["content"] = content
    if tool_calls:
        delta["tool_calls"] = tool_calls
    return {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}


def _chunk(
    call: PreparedCall, responses: ResponseBuilder, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One chunk around `choices` (and `usage` for the last chunk, when asked)."""
    chunk: dict[str, Any] = {
        "id": call.id,
        "object": "chat.completion.chunk" if call.chat else "text_completion",
        "created": call.created,
        "model": responses.model_name,
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    if call.trajectory_id is not None:
        chunk["trajectory_id"] = call.trajectory_id
    return chunk
