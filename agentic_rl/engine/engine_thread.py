"""What `VLLMEngine`'s engine thread does: read the queued `commands`, then run one `LLMEngine.step()`, in a loop.

All state here belongs to the engine thread; the event loop only puts messages in the inbox and reads
`len(pending)`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.engine.base import Generation
from agentic_rl.engine.commands import Abort, AddRequest, Call, Command, Stop
from agentic_rl.engine.weight_copy import ScratchPool
from agentic_rl.errors import EngineError, EngineRejectedError

__all__ = ["EngineThread"]

logger = logging.getLogger(__name__)


def _sampled_logprobs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """The logprob of each sampled token, from vLLM's per-position logprob containers."""
    if logprobs is None:
        return [0.0] * len(token_ids)
    starts = getattr(logprobs, "start_indices", None)
    if starts is not None:  # FlatLogprobs: primitive lists, the sampled token is among each position's entries
        ends, ids, values = logprobs.end_indices, logprobs.token_ids, logprobs.logprobs
        out = []
        for pos, tok in enumerate(token_ids):
            for j in range(starts[pos], ends[pos]):
                if ids[j] == tok:
                    out.append(values[j])
                    break
            else:
                raise EngineError(f"engine returned no logprob for sampled token {tok} at position {pos}")
        return out
    return [position[tok].logprob for tok, position in zip(token_ids, logprobs, strict=True)]


def _top_logprobs(logprobs: Any) -> list[dict[int, float]]:
    """Per position, `{token_id: logprob}` of the top candidates vLLM returned (plus the sampled token)."""
    return [{tok: lp.logprob for tok, lp in position.items()} for position in logprobs]


@dataclass(slots=True)
class _Stream:
    """A streamed request: where its tokens go, and how many were delivered so far."""

    deliver: Any
    sent: int = 0


class EngineThread:
    """The engine thread's state, and one handler per `commands` message.

    Attributes:
        inbox: the messages from the event loop, in the order they were sent.
        pending: request id -> result of each request taken from the inbox that has neither finished nor been
            aborted (held requests included).
        stale_cache: True from a weight update whose prefix-cache reset failed until a reset succeeds; meanwhile
            new requests are held back so that none can reuse KV of the old weights. Set by the weight update,
            which runs on this thread.
        scratch: reused by in-place weight sync (`weight_copy.copy_weights`).
    """

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.pending: dict[str, concurrent.futures.Future[Generation]] = {}
        self.stale_cache = False
        self.scratch: ScratchPool = {}
        self._held: list[AddRequest] = []  # taken while the cache was stale: added once a reset succeeds
        self._top_k: dict[str, int] = {}  # requests that asked for top-k logprobs
        self._streams: dict[str, _Stream] = {}

    def run(self, llm: Any) -> None:
        """Handle messages and step the engine until a `Stop` message; blocks while there is nothing to step."""
        engine = llm.llm_engine
        while True:
            if self.stale_cache and not engine.has_unfinished_requests():
                self._retry_cache_reset(llm)
            block = not engine.has_unfinished_requests()
            while True:
                try:
                    command = self.inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                if not self._handle(llm, command):
                    return
            if engine.has_unfinished_requests():
                for output in engine.step():
                    self._on_output(output)

    def _handle(self, llm: Any, command: Command) -> bool:
        """Act on one message; False for `Stop`."""
        match command:
            case AddRequest():
                self._on_add(llm, command)
            case Abort():
                self._on_abort(llm, command)
            case Call():
                self._on_call(llm, command)
            case Stop():
                return False
        return True

    def _on_add(self, llm: Any, request: AddRequest) -> None:
        if not request.result.set_running_or_notify_cancel():
            return
        self.pending[request.request_id] = request.result
        if self.stale_cache:  # it could reuse KV of the old weights: it waits for the reset
            self._held.append(request)
        else:
            self._submit(llm, request)

    def _submit(self, llm: Any, request: AddRequest) -> None:
        """Hand a pending request to vLLM; one vLLM refuses fails alone with `EngineRejectedError`."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        request_id, deliver = request.request_id, request.deliver
        try:
            output_kind = RequestOutputKind.CUMULATIVE if deliver else RequestOutputKind.FINAL_ONLY
            params = SamplingParams(output_kind=output_kind, **request.sampling)
            llm.llm_engine.add_request(request_id, {"prompt_token_ids": request.prompt_ids}, params)
        except Exception as exc:  # a bad request fails alone
            del self.pending[request_id]
            request.result.set_exception(EngineRejectedError(f"request rejected by vLLM: {exc}"))
            return
        if request.sampling["logprobs"]:
            self._top_k[request_id] = request.sampling["logprobs"]
        if deliver:
            self._streams[request_id] = _Stream(deliver)

    def _on_abort(self, llm: Any, abort: Abort) -> None:
        request_id = abort.request_id
        self._top_k.pop(request_id, None)
        self._streams.pop(request_id, None)
        if self.pending.pop(request_id, None) is not None:
            held = [request for request in self._held if request.request_id != request_id]
            if len(held) == len(self._held):
                llm.llm_engine.abort_request([request_id])
            self._held = held

    @staticmethod
    def _on_call(llm: Any, call: Call) -> None:
        if call.result.set_running_or_notify_cancel():
            try:
                call.result.set_result(call.fn(llm))
            except Exception as exc:
                call.result.set_exception(exc)

    def _retry_cache_reset(self, llm: Any) -> None:
        """With no request running, reset the prefix cache left stale by a weight update, then admit held requests."""
        held, self._held = self._held, []
        if llm.reset_prefix_cache():
            self.stale_cache = False
            logger.info("prefix cache reset after the weight update; %d held requests admitted", len(held))
            for request in held:
                self._submit(llm, request)
            return
        error = EngineError("the prefix cache could not be reset after a weight update, even with no request running")
        for request in held:
            result = self.pending.pop(request.request_id, None)
            if result is not None:
                result.set_exception(error)

    def _on_output(self, output: Any) -> None:
        """Deliver a streamed request's new tokens, or resolve a finished request's result."""
        request_id = output.request_id
        if not output.finished:
            if request_id in self._streams:
                self._deliver(self._streams[request_id], output, self._top_k.get(request_id, 0))
            return
        self._streams.pop(request_id, None)
        result = self.pending.pop(request_id, None)
        if result is None:
            return
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        try:
            generation = Generation(
                token_ids=token_ids,
                logprobs=_sampled_logprobs(token_ids, completion.logprobs),
                finish_reason=completion.finish_reason or "abort",
                stop_reason=completion.stop_reason,
                top_logprobs=_top_logprobs(completion.logprobs) if self._top_k.pop(request_id, 0) else None,
            )
        except Exception as exc:
            result.set_exception(EngineError(f"could not read engine output: {exc}"))
            return
        result.set_result(generation)

    @staticmethod
    def _deliver(stream: _Stream, output: Any, top_k: int) -> None:
        """Hand a streamed request's tokens sampled since the last delivery to its reader."""
        completion = output.outputs[0]
        new_ids = list(completion.token_ids[stream.sent :])
        if not new_ids:
            return
        logprobs = None if completion.logprobs is None else completion.logprobs[stream.sent :]
        try:
            delta = Generation(
                token_ids=new_ids,
                logprobs=_sampled_logprobs(new_ids, logprobs),
                finish_reason="",
                top_logprobs=_top_logprobs(logprobs) if top_k and logprobs is not None else None,
            )
        except Exception:  # the final output reports the problem through the request's result
            logger.exception("could not read a streamed engine output")
            return
        stream.sent += len(new_ids)
        try:
            stream.deliver(delta)
        except RuntimeError:  # the reader's event loop is closed: nobody reads, its abort is on the way
            logger.debug("dropped a streamed delta: the reader's event loop is closed")

    def fail_all(self, exc: EngineError) -> None:
        """Fail every pending request with `exc` (when the thread ends)."""
        for result in self.pending.values():
            if not result.done():
                result.set_exception(exc)
        self.pending.clear()
