"""What `VLLMEngine`'s engine thread does: read the queued `commands`, then run one `LLMEngine.step()`, in a loop.

All state here belongs to the engine thread; the event loop only puts messages in the inbox and reads
`len(pending)`. In a tensor-parallel group (`agentic_rl.engine.tensor_parallel`) the leader's thread sends each
batch of messages to the followers before acting on it, and a follower's thread takes its messages from its leader
(only the weights of a sync from its own inbox), so that every shard acts alike and steps with the others.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentic_rl.engine import weight_copy
from agentic_rl.engine.adapters import AdapterSlots
from agentic_rl.engine.base import Generation
from agentic_rl.engine.commands import (
    Abort,
    AddRequest,
    Call,
    Command,
    LoadAdapter,
    SetPaused,
    Sleep,
    Stop,
    UpdateWeights,
    WakeUp,
    wire,
)
from agentic_rl.engine.load_log import counted_casts
from agentic_rl.engine.weight_copy import ScratchPool
from agentic_rl.errors import EngineError, EngineRejectedError

if TYPE_CHECKING:
    from agentic_rl.engine.tensor_parallel import GroupChannel

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
class _Sampled:
    """What one request sampled so far, gathered from vLLM's per-step deltas on the engine thread.

    Attributes:
        token_ids, logprobs: the sampled ids and their logprobs (nats), in order.
        weight_versions: per id, `EngineThread.weight_version` at the engine step that sampled it, or `pinned`.
        top_logprobs: per position, `{token_id: logprob}` when the request asked for top logprobs, else None.
        deliver: for a streamed request, where each step's new tokens go; else None.
        pinned: on a LoRA engine, the version of the adapter (or base model) the request samples every token with;
            None elsewhere.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    deliver: Callable[[Generation], None] | None = None
    pinned: int | None = None

    def add(self, completion: Any, weight_version: int) -> None:
        """Append the tokens of one engine step (vLLM's DELTA `CompletionOutput`), all sampled at `weight_version`.

        Raises:
            EngineError: if a sampled token has no logprob (nothing is appended then).
        """
        ids = list(completion.token_ids)
        logprobs = _sampled_logprobs(ids, completion.logprobs)
        if self.top_logprobs is not None:
            positions = completion.logprobs
            self.top_logprobs.extend(_top_logprobs(positions) if positions is not None else [{} for _ in ids])
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.weight_versions.extend([weight_version] * len(ids))

    def since(self, start: int) -> Generation:
        """The tokens from position `start` on, as an item of a stream (`finish_reason` "")."""
        tops = self.top_logprobs
        return Generation(
            token_ids=self.token_ids[start:],
            logprobs=self.logprobs[start:],
            finish_reason="",
            top_logprobs=None if tops is None else tops[start:],
            weight_versions=self.weight_versions[start:],
        )


class EngineThread:
    """The engine thread's state, and one handler per `commands` message.

    Every request is sent to vLLM with `RequestOutputKind.DELTA`: each engine step hands back only the tokens it
    sampled, which are stamped with `weight_version` as it is at that step and gathered here until the request
    finishes. A weight update runs on this thread between two steps and bumps `weight_version` there, so every
    token carries the version of the weights whose forward pass sampled it. On a LoRA engine (`adapters`) each
    request is pinned to the adapter that is the latest when it is submitted, and its tokens carry that version.

    Attributes:
        inbox: the messages from the event loop, in the order they were sent.
        pending: request id -> result of each request taken from the inbox that has neither finished nor been
            aborted (held requests included).
        weight_version: the version of the weights loaded now; only this thread changes it (between two steps).
        paused: while True the thread runs no engine step: requests keep their tokens and KV cache, new ones are
            added and wait, messages (weight updates included) are still handled. Set by `SetPaused` messages.
        stale_cache: True from a weight update whose prefix-cache reset failed until a reset succeeds; meanwhile
            new requests are held back so that none can reuse KV of the old weights. Set by the weight update,
            which runs on this thread.
        scratch: reused by in-place weight sync (`weight_copy.copy_weights`).
        adapters: the LoRA adapters and the requests on each (`adapters.AdapterSlots`); None without LoRA.
        channel: in a tensor-parallel group, the leader's messages to its followers (`tensor_parallel.GroupChannel`),
            set before the thread runs; None for an engine of one process.
    """

    def __init__(
        self, weight_version: int = 0, adapters: AdapterSlots | None = None, channel: GroupChannel | None = None
    ) -> None:
        self.inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.pending: dict[str, concurrent.futures.Future[Generation]] = {}
        self.weight_version = weight_version
        self.paused = False
        self.stale_cache = False
        self.scratch: ScratchPool = {}
        self.adapters = adapters
        self.channel = channel
        if adapters is not None:
            adapters.on_latest = self._adapter_loaded
        self._held: list[AddRequest] = []  # taken while the cache was stale: added once a reset succeeds
        self._sampled: dict[str, _Sampled] = {}  # the tokens of each request submitted to vLLM

    @property
    def follower(self) -> bool:
        """True on a tensor-parallel group's follower: its messages come from the leader."""
        return self.channel is not None and not self.channel.group.is_leader

    def run(self, llm: Any) -> None:
        """Handle messages and step the engine until a `Stop` message; blocks while there is nothing to step.

        Raises:
            GroupDriftError: in a tensor-parallel group, when this shard's state differs from its leader's.
        """
        engine = llm.llm_engine
        while True:
            if self.stale_cache and not engine.has_unfinished_requests():
                self._retry_cache_reset(llm)
            if self.follower:
                commands = self.channel.receive()
            else:
                commands = self._take(block=self.paused or not engine.has_unfinished_requests())
                if self.channel is not None:  # before acting: a weight sync's collectives need every rank
                    self.channel.send([wire(command) for command in commands if not isinstance(command, Call)])
            for command in commands:
                if not self._handle(llm, self._replayed(command) if self.follower else command):
                    return
            step = not self.paused and engine.has_unfinished_requests()
            if self.channel is not None:
                self.channel.agree(self._digest(step))
            if step:
                for output in engine.step():
                    self._on_output(llm, output)

    def _take(self, *, block: bool) -> list[Command]:
        """The messages in the inbox (waiting for one when `block`), without those whose caller gave up first."""
        commands: list[Command] = []
        while True:
            try:
                command = self.inbox.get(block=block and not commands)
            except queue.Empty:
                return commands
            result = getattr(command, "result", None)
            claimed = isinstance(command, Call | LoadAdapter)  # a call claims itself; a sync may wait for a slot
            if claimed or result is None or result.set_running_or_notify_cancel():
                commands.append(command)

    def _replayed(self, command: Command) -> Command:
        """(Follower) the leader's message as this shard acts on it: a request with a future nobody reads, a sync
        with the weights (or adapter folder) of this rank's own next sync, waited for in the inbox."""
        match command:
            case AddRequest():
                return dataclasses.replace(command, result=concurrent.futures.Future())
            case UpdateWeights() | LoadAdapter():
                return self._own(type(command))
        return command

    def _own(self, kind: type) -> Command:
        """(Follower) this rank's next message of `kind` from its own inbox (a `Stop` there ends the wait)."""
        while True:
            command = self.inbox.get()
            if isinstance(command, kind | Stop):
                return command
            logger.warning("a follower of a tensor-parallel engine ignored %s: its leader drives it", command)

    def _digest(self, step: bool) -> Any:
        from agentic_rl.engine.tensor_parallel import StepDigest

        return StepDigest(
            step, len(self.pending), len(self._sampled), self.weight_version, self.paused, self.stale_cache
        )

    def _handle(self, llm: Any, command: Command) -> bool:
        """Act on one message; False for `Stop`."""
        match command:
            case AddRequest():
                self._on_add(llm, command)
            case Abort():
                self._on_abort(llm, command)
            case Call():
                self._on_call(llm, command)
            case LoadAdapter():
                self._on_load_adapter(llm, command)
            case UpdateWeights():
                self._on_update_weights(llm, command)
            case SetPaused():
                self.paused = command.paused
                _settle(command.result, None)
            case Sleep():
                _settle_call(command.result, lambda: llm.sleep(level=command.level))
            case WakeUp():
                _settle_call(command.result, lambda: llm.wake_up(tags=command.tags))
            case Stop():
                return False
        return True

    def _on_update_weights(self, llm: Any, command: UpdateWeights) -> None:
        """Load the weights, then bump the version and drop the KV of the old weights, before the next step."""
        t0 = time.perf_counter()
        try:
            with counted_casts(f"weight sync to version {self.weight_version + 1}"):
                path = weight_copy.load_weights(llm, command.source, self.scratch, reload=command.reload)
        except Exception as exc:
            _settle(command.result, exc=exc)
            return
        self.weight_version += 1
        self.stale_cache = not _drop_old_kv(llm)
        _settle(command.result, (time.perf_counter() - t0, path))

    def _on_add(self, llm: Any, request: AddRequest) -> None:
        self.pending[request.request_id] = request.result
        if self.stale_cache:  # it could reuse KV of the old weights: it waits for the reset
            self._held.append(request)
        else:
            self._submit(llm, request)

    def _submit(self, llm: Any, request: AddRequest) -> None:
        """Hand a pending request to vLLM; one vLLM refuses fails alone with `EngineRejectedError`."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        request_id = request.request_id
        pinned, lora = self.adapters.take() if self.adapters is not None else (None, None)
        try:
            params = SamplingParams(output_kind=RequestOutputKind.DELTA, **request.sampling)
            llm.llm_engine.add_request(request_id, _engine_input(llm, request.prompt_ids), params, lora_request=lora)
        except Exception as exc:  # a bad request fails alone
            del self.pending[request_id]
            request.result.set_exception(EngineRejectedError(f"request rejected by vLLM: {exc}"))
            self._release(llm, pinned)
            return
        top: list[dict[int, float]] | None = [] if request.sampling["logprobs"] else None
        self._sampled[request_id] = _Sampled(top_logprobs=top, deliver=request.deliver, pinned=pinned)

    def _on_abort(self, llm: Any, abort: Abort) -> None:
        request_id = abort.request_id
        sampled = self._sampled.pop(request_id, None)
        if self.pending.pop(request_id, None) is not None:
            held = [request for request in self._held if request.request_id != request_id]
            if len(held) == len(self._held):
                llm.llm_engine.abort_request([request_id])
            self._held = held
        if sampled is not None:
            self._release(llm, sampled.pinned)

    def _on_load_adapter(self, llm: Any, command: LoadAdapter) -> None:
        if self.adapters is None:  # VLLMEngine checks first; a message sent anyway fails alone
            if command.result.set_running_or_notify_cancel():
                command.result.set_exception(EngineError("LoRA is off on this engine"))
            return
        self.adapters.request_load(llm, command, self.paused)  # a load sets the weight version (`_adapter_loaded`)

    def _adapter_loaded(self, version: int) -> None:
        self.weight_version = version

    def _release(self, llm: Any, pinned: int | None) -> None:
        """A request pinned to an adapter version ended: let `adapters` drop what nothing uses any more."""
        if pinned is not None and self.adapters is not None:
            self.adapters.release(llm, pinned)  # may run a parked load, which sets the weight version

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

    def _on_output(self, llm: Any, output: Any) -> None:
        """Add one step's new tokens to the request's, stamped with the current `weight_version`; hand them to a
        streamed request's reader; resolve the request's result when it finished."""
        request_id = output.request_id
        sampled = self._sampled.get(request_id)
        if sampled is None:  # aborted meanwhile
            return
        completion = output.outputs[0]
        if completion.token_ids:
            start = len(sampled.token_ids)
            try:
                sampled.add(completion, self.weight_version if sampled.pinned is None else sampled.pinned)
            except Exception as exc:
                self._sampled.pop(request_id)
                result = self.pending.pop(request_id, None)
                if result is not None:
                    result.set_exception(EngineError(f"could not read engine output: {exc}"))
                if not output.finished:  # stop it in vLLM too: nothing reads it, and its adapter may go
                    llm.llm_engine.abort_request([request_id])
                self._release(llm, sampled.pinned)
                return
            if sampled.deliver is not None and not output.finished:
                _hand_over(sampled.deliver, sampled.since(start))
        if not output.finished:
            return
        del self._sampled[request_id]
        result = self.pending.pop(request_id, None)
        self._release(llm, sampled.pinned)
        if result is not None:
            result.set_result(
                Generation(
                    token_ids=sampled.token_ids,
                    logprobs=sampled.logprobs,
                    finish_reason=completion.finish_reason or "abort",
                    stop_reason=completion.stop_reason,
                    top_logprobs=sampled.top_logprobs,
                    weight_versions=sampled.weight_versions,
                )
            )

    def fail_all(self, exc: EngineError) -> None:
        """Fail every pending request, and every sync waiting for an adapter slot, with `exc` (when the thread ends)."""
        for result in self.pending.values():
            if not result.done():
                result.set_exception(exc)
        self.pending.clear()
        if self.adapters is not None:
            self.adapters.fail_parked(exc)


def _engine_input(llm: Any, prompt_ids: list[int]) -> Any:
    """The prompt as vLLM's engine takes it: rendered by the engine's own renderer (`render_cmpl`, which checks the
    ids as vLLM's `generate` does), not the raw prompt vLLM 0.32 still takes with a deprecation warning."""
    renderer = getattr(llm.llm_engine, "renderer", None)
    if renderer is None or not hasattr(renderer, "render_cmpl"):  # an older vLLM: the raw prompt is its API
        return {"prompt_token_ids": prompt_ids}
    (engine_input,) = renderer.render_cmpl([{"prompt_token_ids": prompt_ids}])
    return engine_input


def _settle(
    result: concurrent.futures.Future[Any] | None, value: Any = None, *, exc: BaseException | None = None
) -> None:
    """Resolve `result` with `value` (or fail it with `exc`); nothing for None (a follower's replayed message)."""
    if result is None or result.done():
        return
    if exc is None:
        result.set_result(value)
    else:
        result.set_exception(exc)


def _settle_call(result: concurrent.futures.Future[Any] | None, fn: Callable[[], Any]) -> None:
    """Run `fn` and resolve `result` with None, or fail it with what `fn` raised."""
    try:
        fn()
    except Exception as exc:
        _settle(result, exc=exc)
        return
    _settle(result, None)


def _drop_old_kv(llm: Any) -> bool:
    """Reset the prefix cache after a weight update; True when no KV computed with the old weights is left.

    A plain reset fails while any request holds KV blocks, and a request in flight would go on caching blocks built
    on its old KV. So the requests in flight are preempted first (vLLM's `reset_running_requests`): their blocks are
    freed and, on the next step, recomputed from their prompt and the tokens sampled so far, with the new weights.
    vLLM versions without that option, or a preemption that cannot free every block, give False.
    """
    import inspect

    reset = llm.reset_prefix_cache
    try:
        if "reset_running_requests" in inspect.signature(reset).parameters:
            return bool(reset(reset_running_requests=True))
        return bool(reset())
    except RuntimeError:  # vLLM: blocks still held after preemption (e.g. waiting for a remote KV transfer)
        logger.warning("prefix cache reset after a weight update failed; new requests wait for it", exc_info=True)
        return False


def _hand_over(deliver: Callable[[Generation], None], delta: Generation) -> None:
    """Give a streamed request's reader the tokens one step sampled."""
    try:
        deliver(delta)
    except RuntimeError:  # the reader's event loop is closed: nobody reads, its abort is on the way
        logger.debug("dropped a streamed delta: the reader's event loop is closed")
