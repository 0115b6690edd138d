"""vLLM running inside the caller's process, driven from the event loop by one engine thread.

Why a thread around the synchronous `vllm.LLM` and not `AsyncLLM`: `AsyncLLM` always runs its engine core in a
separate process, so weights could only reach it through files or serialized RPC. `vllm.LLM` with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the model in this process, so weight sync can hand over tensors
directly. One thread builds the `LLM` (building it on the thread that steps it was ~30% faster here) and loops:
take queued requests and control calls (the messages of `commands`), then run one `LLMEngine.step()` (see
`engine_thread`). Each request resolves a `concurrent.futures.Future` that the awaiting coroutine wraps, so any
number of trajectories share the engine's continuous batching.

This module needs the asyncio backend of anyio (uvloop included).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from agentic_rl.engine import tensor_parallel
from agentic_rl.engine.adapters import AdapterSlots, check_adapter_folder
from agentic_rl.engine.base import Generation
from agentic_rl.engine.commands import (
    Abort,
    AddRequest,
    Call,
    LoadAdapter,
    SetPaused,
    Sleep,
    Stop,
    UpdateWeights,
    WakeUp,
)
from agentic_rl.engine.engine_thread import EngineThread
from agentic_rl.engine.load_log import counted_casts, quiet_native_stderr, quiet_vllm
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.vllm_config import VLLMEngineConfig, llm_kwargs, on_accelerator
from agentic_rl.errors import EngineError

__all__ = ["VLLMEngine", "VLLMEngineConfig"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class VLLMEngine:
    """An in-process vLLM engine that many coroutines can await at once.

    Use as `async with VLLMEngine(config) as engine:` or call `start()` / `close()`.

    With a `group` (`tensor_parallel.EngineGroup`, under torchrun) the engine is one tensor-parallel vLLM engine
    over the group's T ranks, each process building its shard: every rank of the group calls `start`, then the
    leader (group rank 0) samples, pauses, sleeps and loads weights for the group, and every other rank (a follower)
    only replays what its leader does (`agentic_rl.engine.tensor_parallel`). On a follower `generate`, `stream` and
    `call` are refused; `update_weights` and `update_adapter` hand over this rank's weights for the sync the leader
    runs (each shard loads its part from the full tensors); `pause_generation`, `resume_generation`, `sleep` and
    `wake_up` do nothing (the leader's are replayed). A group whose shards can no longer step together (a rank
    dead or stalled for `group.timeout_s`, a shard out of step, an engine thread that failed) stops the process
    with an error naming the rank: it would otherwise wait forever.

    Raises:
        EngineError: from `generate` when the engine is not started, was closed, failed, or rejected the request.
    """

    def __init__(self, config: VLLMEngineConfig, group: tensor_parallel.EngineGroup | None = None) -> None:
        self.config = config
        self.group = group if group is not None and group.size > 1 else None
        self._watchdog: Any = None
        # The engine thread's state; the event loop only sends it messages (and reads its weight version).
        adapters = None if config.max_lora_rank is None else AdapterSlots(config.max_loras, config.weight_version)
        self._worker = EngineThread(config.weight_version, adapters)
        self._thread: threading.Thread | None = None
        self._ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._ids = itertools.count()
        self._seeds = itertools.count()
        self._max_model_len = config.max_model_len
        self._dead: BaseException | None = None
        self._closed = False
        self.last_weight_sync: str | None = None  # how the last weight sync loaded (the path, for logs/tests)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def is_follower(self) -> bool:
        """True on a tensor-parallel group's follower (group rank > 0): its leader drives the engine."""
        return self.group is not None and not self.group.is_leader

    @property
    def in_flight_requests(self) -> int:
        """Requests the engine thread holds that have neither finished nor been aborted yet.

        A cancelled `generate` call's abort is queued to the engine thread, so the count drops on its next loop
        iteration (at once when idle, after the current `step()` otherwise).
        """
        return len(self._worker.pending)

    async def start(self) -> None:
        """Build the engine on its own thread and wait until it accepts requests.

        Raises:
            EngineError: if vLLM fails to build the engine.
        """
        self._launch()
        try:
            self._max_model_len = await asyncio.wrap_future(self._ready)
        except Exception as exc:
            raise EngineError(f"vLLM engine failed to start for {self.config.model}: {exc}") from exc
        logger.info("vLLM engine ready: %s, max_model_len=%d", self.config.model, self._max_model_len)

    def start_sync(self) -> None:
        """Like `start()`, blocking the calling thread until the engine is ready (for synchronous set-up code)."""
        self._launch()
        try:
            self._max_model_len = self._ready.result()
        except Exception as exc:
            raise EngineError(f"vLLM engine failed to start for {self.config.model}: {exc}") from exc
        logger.info("vLLM engine ready: %s, max_model_len=%d", self.config.model, self._max_model_len)

    def _launch(self) -> None:
        if self._thread is not None:
            raise EngineError("engine already started")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._thread = threading.Thread(target=self._run, name="agentic-rl-engine", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop the engine thread and free the model; pending requests fail with EngineError. Idempotent."""
        if self._closed or self._thread is None:
            self._closed = True
            return
        self._closed = True
        self._worker.inbox.put(Stop())  # a follower's thread ends at its leader's Stop (or here, waiting for weights)
        timeout = self.group.timeout_s if self.is_follower else None
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._thread.join, timeout)
        if self._thread.is_alive():
            logger.warning("the engine of rank %d did not hear its leader stop within %g s", self._rank, timeout)
        if self._watchdog is not None:
            self._watchdog.close()

    @property
    def _rank(self) -> int:
        return 0 if self.group is None else self.group.global_rank(self.group.rank)

    def _check_samples(self) -> None:
        if self.is_follower:
            raise EngineError(
                f"rank {self._rank} serves a shard of the tensor-parallel engine of group {self.group.index}: only "
                f"its leader (rank {self.group.leader}) samples, calls and controls it"
            )

    async def __aenter__(self) -> VLLMEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_alive(self) -> None:
        if self._thread is None or not self._ready.done():
            raise EngineError("engine not started: call `await engine.start()` first")
        if self._closed:
            raise EngineError("engine is closed")
        if self._dead is not None:
            raise EngineError(f"engine failed earlier: {self._dead}")

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig | Mapping[str, Any]) -> Generation:
        """Sample a continuation of `prompt_ids`; see `Engine.generate`.

        `sampling` is a `SamplingConfig` (a dict of its options is accepted and checked). The engine always records
        the sampled token's logprob and skips detokenization unless stop strings need it. Cancelling the awaiting
        task aborts the request in the engine.

        Raises:
            ConfigError: for a dict with an unknown option or a bad value (nothing is sent to the engine).
            EngineError: if the engine is not running or rejects the request.
        """
        options = SamplingConfig.of(sampling).engine_kwargs()
        self._check_alive()
        self._check_samples()
        request_id = str(next(self._ids))
        result: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        self._worker.inbox.put(AddRequest(request_id, list(prompt_ids), self._seeded(options), result))
        try:
            return await asyncio.wrap_future(result)
        finally:
            if not result.done() or result.cancelled():
                self._worker.inbox.put(Abort(request_id))

    async def stream(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig | Mapping[str, Any]
    ) -> AsyncIterator[Generation]:
        """Like `generate`, but yields the sampled tokens as the engine steps.

        Each item holds only the tokens sampled since the previous one (with their logprobs and top logprobs);
        every item but the last has `finish_reason == ""`, the last carries the finish and stop reason. Together
        the items hold exactly what `generate` returns. Closing the iterator early (or cancelling the task
        reading it) aborts the request in the engine.

        Raises:
            ConfigError: for a dict with an unknown option or a bad value (nothing is sent to the engine).
            EngineError: if the engine is not running or rejects the request.
        """
        options = SamplingConfig.of(sampling).engine_kwargs()
        self._check_alive()
        self._check_samples()
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[Generation | None] = asyncio.Queue()

        def deliver(item: Generation | None) -> None:  # called on the engine thread
            loop.call_soon_threadsafe(deltas.put_nowait, item)

        request_id = str(next(self._ids))
        result: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        result.add_done_callback(lambda _: deliver(None))  # wakes the reader when the request ends or fails
        self._worker.inbox.put(AddRequest(request_id, list(prompt_ids), self._seeded(options), result, deliver))
        sent = 0
        try:
            while (delta := await deltas.get()) is not None:
                sent += len(delta.token_ids)
                yield delta
            final = await asyncio.wrap_future(result)
            yield Generation(
                token_ids=final.token_ids[sent:],
                logprobs=final.logprobs[sent:],
                finish_reason=final.finish_reason,
                stop_reason=final.stop_reason,
                top_logprobs=None if final.top_logprobs is None else final.top_logprobs[sent:],
                weight_versions=None if final.weight_versions is None else final.weight_versions[sent:],
            )
        finally:
            if not result.done() or result.cancelled():
                self._worker.inbox.put(Abort(request_id))

    @property
    def weight_version(self) -> int:
        """How many weight updates the weights went through (`config.weight_version` = those it was built with).

        The engine thread bumps it inside `update_weights`, between two engine steps, so it is the version of the
        weights the next engine step samples with; the `weight_versions` of each `Generation` are read from it. On
        a LoRA engine `update_adapter` bumps it, and it is the version of the adapter new requests get.
        """
        return self._worker.weight_version

    @property
    def generation_paused(self) -> bool:
        """True between `pause_generation` and `resume_generation` (as the engine thread last saw them)."""
        return self._worker.paused

    async def pause_generation(self) -> None:
        """Stop sampling until `resume_generation`, keeping every request in flight and its KV cache.

        Once this returns, the engine thread runs no engine step: requests in flight keep the tokens sampled so far
        (a stream has been handed every one of them), new requests are accepted and wait, and `call` and
        `update_weights` still run, so the tokens sampled after resuming carry the new `weight_version`.
        Idempotent; `close()` while paused fails what is pending, as always.

        Raises:
            EngineError: if the engine is not running.
        """
        await self._control(lambda result: SetPaused(True, result))

    async def resume_generation(self) -> None:
        """Sample again after `pause_generation`: paused and waiting requests continue. Idempotent.

        Raises:
            EngineError: if the engine is not running.
        """
        await self._control(lambda result: SetPaused(False, result))

    def _seeded(self, options: dict[str, Any]) -> dict[str, Any]:
        """A sampled request's options with a seed of its own in a tensor-parallel group: each shard samples with
        its own generator, and the process-wide one also serves whatever else the process draws (its trainer)."""
        if self.group is None or options.get("seed") is not None or not options.get("temperature", 1.0):
            return options
        return {**options, "seed": (self.config.seed * 1_000_003 + next(self._seeds)) % (1 << 63)}

    async def _control(self, make: Callable[[concurrent.futures.Future[Any]], Any]) -> Any:
        """Send the engine thread the message `make(result)` and wait for its result; on a follower, nothing (the
        leader's is replayed).

        Raises:
            EngineError: if the engine is not running, or what the message did raised (chained).
        """
        self._check_alive()
        if self.is_follower:
            return None
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._worker.inbox.put(make(result))
        try:
            return await asyncio.wrap_future(result)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"engine message failed: {exc}") from exc

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> float:
        """Load new weights into the running engine, in place, between two engine steps.

        Requests in flight are not aborted: the engine thread stops stepping while it loads, then they continue
        with the new weights. No KV computed with the old weights is reused afterwards: the requests in flight are
        preempted, so that their KV is recomputed with the new weights on the next step (they keep the tokens
        sampled so far), and the prefix cache is reset. Where that reset cannot be done at once (a vLLM without
        preemption on reset), requests that arrive later wait until the requests in flight have finished and the
        reset succeeded. `weight_version` goes up by one on the engine thread, before its next step: a request in
        flight has the old version on the tokens sampled before and the new one on those after
        (`Generation.weight_versions`).

        How the weights are loaded follows `config.weight_sync`: on vLLM's CPU backend, an in-place copy through the
        model's own loaders that re-packs only layers served from a packed copy (see `weight_copy`); elsewhere, or
        with `reload`, vLLM's `reload_weights`. `last_weight_sync` and the log line say which path ran, and why the
        in-place copy was not used.

        Args:
            named_tensors: `(name, tensor)` pairs in Hugging Face naming (e.g. a training model's
                `named_parameters()`); a tied `lm_head.weight` is skipped, vLLM derives it from the embedding. They
                are read one at a time on the engine thread, each loaded before the next is read, so a lazy source
                (a sharded trainer's `named_weights`, gathering each parameter as it is read) adds no more than one
                tensor at a time; it is read to its end even when loading fails (its reads may be collectives).

        Returns:
            Seconds spent loading.

        Raises:
            EngineError: if vLLM rejects the weights (the engine keeps running on whatever it had loaded), or a
                packed layer got only some of its shards (that layer keeps its previous weights); on a LoRA engine
                (`config.max_lora_rank` set), always: its base weights are never re-sent, use `update_adapter`.
        """
        if self.lora_enabled:
            raise EngineError(
                "update_weights: this engine serves LoRA adapters on frozen base weights "
                "(VLLMEngineConfig.max_lora_rank is set); sync with update_adapter(folder)"
            )
        self._check_alive()
        reload = self.config.weight_sync == "reload"
        result: concurrent.futures.Future[tuple[float, str]] = concurrent.futures.Future()
        self._worker.inbox.put(UpdateWeights(iter(named_tensors), reload, result))  # a follower's waits for its leader
        try:
            seconds, path = await asyncio.wrap_future(result)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"engine call 'load' failed: {exc}") from exc
        self.last_weight_sync = path
        logger.info("weights updated to version %d in %.2f s: %s", self._worker.weight_version, seconds, path)
        return seconds

    @property
    def lora_enabled(self) -> bool:
        """True when the engine serves LoRA adapters (`config.max_lora_rank` set): sync with `update_adapter`."""
        return self._worker.adapters is not None

    async def update_adapter(self, folder: str | os.PathLike[str]) -> None:
        """Load the peft LoRA adapter saved in `folder` as the next weight version (see `agentic_rl.engine.adapters`).

        `folder` holds `adapter_config.json` and `adapter_model.safetensors`, as peft's `save_pretrained` writes
        them; it is read during this call only. On return `weight_version` is one higher and every request sent
        from then on samples with this adapter. Requests in flight go on with the adapter they started with (the
        base model before the first sync): their `Generation.weight_versions` hold that version for every token.
        Adapters no request uses any more are removed; at most `config.max_loras` are held. When that many are
        still used by requests in flight, this waits until one of them ends, or fails while generation is paused.

        Raises:
            EngineError: LoRA is off (`config.max_lora_rank` is None); the engine is not running; `folder` is missing
                or holds no valid adapter, or its rank exceeds `config.max_lora_rank`; vLLM refused it; all
                `max_loras` adapters are in use while paused. The engine keeps serving its latest version then.
        """
        rank = self.config.max_lora_rank
        if rank is None:
            raise EngineError("update_adapter: LoRA is off on this engine; set VLLMEngineConfig.max_lora_rank")
        self._check_alive()
        path = check_adapter_folder(folder, rank)
        result: concurrent.futures.Future[tuple[int, float]] = concurrent.futures.Future()
        t0 = time.perf_counter()
        self._worker.inbox.put(LoadAdapter(path, result))
        version, seconds = await asyncio.wrap_future(result)
        self.last_weight_sync = f"LoRA adapter {path} as version {version}"
        logger.info(
            "LoRA adapter %s loaded as weight version %d in %.3f s (%.3f s with waiting)",
            path,
            version,
            seconds,
            time.perf_counter() - t0,
        )

    async def loaded_adapters(self) -> list[int]:
        """The weight versions whose LoRA adapters vLLM holds now (their LoRA ids), ascending; [] without LoRA.

        Raises:
            EngineError: if the engine is not running.
        """
        if not self.lora_enabled:
            return []
        return sorted(await self.call(lambda llm: llm.llm_engine.list_loras()))

    def _can_sleep(self) -> bool:
        if not self.config.enable_sleep_mode:
            logger.info("engine sleep skipped: enable_sleep_mode is off")
            return False
        if not on_accelerator():
            logger.info("engine sleep skipped: vLLM sleep mode is not supported on the CPU; memory stays allocated")
            return False
        return True

    async def sleep(self, level: int = 1) -> bool:
        """Free the engine's accelerator memory while the trainer runs (level 1: offload weights, drop KV cache).

        Returns:
            False (and does nothing) on the CPU or without `enable_sleep_mode`.
        """
        if not self._can_sleep():
            return False
        await self._control(lambda result: Sleep(level, result))
        return True

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Reallocate what `sleep` freed; `tags` `["weights"]` then `["kv_cache"]` lets new weights load in between.

        Returns:
            False (and does nothing) on the CPU or without `enable_sleep_mode`.
        """
        if not self._can_sleep():
            return False
        await self._control(lambda result: WakeUp(tags, result))
        return True

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(llm)` on the engine thread between two engine steps and return its result.

        In-flight requests stay queued and continue afterwards. In a tensor-parallel group `fn` runs on the
        leader's shard only (it is never replayed): it must only read (e.g. `llm.llm_engine.list_loras()`).

        Raises:
            EngineError: if the engine is not running, `fn` raised (chained), or on a group's follower.
        """
        self._check_alive()
        self._check_samples()
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._worker.inbox.put(Call(fn, result))
        try:
            return await asyncio.wrap_future(result)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"engine call {getattr(fn, '__name__', fn)!r} failed: {exc}") from exc

    # ---- engine thread -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _join_group(self) -> Iterator[dict[str, Any]]:
        """Set up the group's process groups and heartbeats, then (while vLLM builds the shard) its launcher."""
        group = self.group
        self._worker.channel = tensor_parallel.GroupChannel(group, tensor_parallel.join_engine_group(group))
        self._watchdog = tensor_parallel.Watchdog(group)
        self._watchdog.start()
        with tensor_parallel.vllm_launch(group) as kwargs:
            yield kwargs

    def _run(self) -> None:
        with quiet_vllm():  # vLLM's start-up noise, and its warning at each thread-count change, unless verbose
            self._build_and_serve()

    def _build_and_serve(self) -> None:
        if self.group is not None:
            # vLLM's tensor-parallel group shares memory, which starts multiprocessing's resource tracker: start it
            # before stderr goes through `quiet_native_stderr`'s pipe, which it would otherwise hold open for ever.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
        try:
            with counted_casts(f"engine start ({self.config.model})"), quiet_native_stderr():
                from vllm import LLM

                kwargs = llm_kwargs(self.config)
                with contextlib.ExitStack() as launch:
                    if self.group is not None:
                        kwargs.update(launch.enter_context(self._join_group()))
                    llm = LLM(**kwargs)
        except BaseException as exc:  # surfaces in start(); the thread ends
            self._ready.set_exception(exc)
            return
        self._ready.set_result(int(llm.llm_engine.model_config.max_model_len))
        try:
            self._worker.run(llm)
        except BaseException as exc:
            logger.exception("vLLM engine thread failed")
            self._dead = exc
            if self.group is not None and not self._closed:  # the other shards would wait for this one forever
                dead = self._watchdog.dead_peers() if self._watchdog is not None else []
                why = f" ({', '.join(dead)} died)" if dead else ""
                tensor_parallel.fatal(
                    f"tensor-parallel engine group {self.group.index}: the engine shard of rank {self._rank} "
                    f"failed{why}: {exc!r}"
                )
        finally:
            why = "engine closed" if self._dead is None else f"engine failed: {self._dead}"
            self._worker.fail_all(EngineError(why))
            del llm
