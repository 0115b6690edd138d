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
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from pydantic import Field, StrictInt, field_validator

from agentic_rl.config import Config
from agentic_rl.engine import weight_copy
from agentic_rl.engine.adapters import MAX_LORA_RANKS, AdapterSlots, check_adapter_folder
from agentic_rl.engine.base import EngineDtype, Generation
from agentic_rl.engine.commands import Abort, AddRequest, Call, LoadAdapter, Stop
from agentic_rl.engine.engine_thread import EngineThread
from agentic_rl.engine.load_log import counted_casts, quiet_native_stderr, quiet_vllm
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import EngineError

__all__ = ["VLLMEngine", "VLLMEngineConfig"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _platform_dtype() -> str:
    from ascend.device import current_platform

    return current_platform().engine_dtype


class VLLMEngineConfig(Config):
    """Options for building the in-process vLLM engine.

    Attributes:
        model: path of a local Hugging Face model folder.
        dtype: weight and activation dtype (`bfloat16`, `float32`, `auto`: the model folder's). Default: the
            platform's (`ascend.device.Platform.engine_dtype`): `bfloat16` on accelerators and on CPUs with native
            bf16 instructions, else `float32`.
        max_model_len: model window in tokens (prompt + response).
        kv_cache_gib: KV-cache size in GiB on the CPU (vLLM's `kv_cache_memory_bytes`); ignored on accelerators,
            which use `gpu_memory_utilization`.
        gpu_memory_utilization: fraction of accelerator memory vLLM may take.
        enforce_eager: skip torch.compile / graph capture (faster start-up, ~10% lower throughput).
        seed: engine seed.
        max_num_seqs: most sequences batched in one engine step.
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes (every turn re-sends its history).
        block_size: KV-cache block size in tokens (None: the platform's; 32 on the CPU). Prefix caching reuses whole
            blocks only, so each turn's continuation recomputes the history's last, partial block: with vLLM's CPU
            default of 128 that was ~80 tokens per continuation (a multi-turn rollout prefilled 31% more tokens
            than the same work in one request); 32 is the smallest block vLLM's CPU backend took here.
        logprobs_mode: which distribution the recorded logprob of each sampled token is of (vLLM's
            `logprobs_mode`; its names `raw_logprobs` / `processed_logprobs` are taken too). `raw`: the model's own
            softmax, before anything `SamplingConfig` changes. `processed`: the distribution the token was sampled
            from, as vLLM 0.32's `Sampler` builds it, in this order: allowed-token and bad-word masks, `min_tokens`
            (stop tokens masked until then) and `logit_bias`, the repetition / frequency / presence penalties,
            the temperature, `min_p`, then top-k and top-p (renormalized over the tokens they keep). The trainer
            reproduces the temperature, top-k and top-p (`train.logprobs.SamplingDistribution`, `GRPOTrainer`'s
            `sampling`), not the rest. A greedy request (temperature 0) reports log softmax of the penalized
            logits. vLLM's FlashInfer and ROCm samplers cannot report processed logprobs; vLLM falls back to its
            PyTorch sampler on those GPUs.
        enable_sleep_mode: let `sleep()` free engine memory while training (GPU/NPU only; ignored on the CPU).
        weight_version: the `weight_version` of the weights in `model` (a resumed training run starts its engine from
            a checkpoint that many updates in).
        weight_sync: how `update_weights` loads: `in_place` copies into the model's parameters and re-packs only
            layers served from a packed copy, where vLLM's CPU backend allows it (else, and with `reload`, vLLM's
            `reload_weights`, which re-processes every layer).
        max_lora_rank: None (default): no LoRA, `update_weights` syncs full weights. An int (one of vLLM's sizes
            `adapters.MAX_LORA_RANKS`): the engine serves peft LoRA adapters of rank up to it on frozen base weights,
            each sync sends only the adapter (`VLLMEngine.update_adapter`), and `update_weights` is refused.
        max_loras: with `max_lora_rank`, the most LoRA adapters the engine holds: the latest and those requests in
            flight still sample with (see `agentic_rl.engine.adapters`); with bounded staleness, `max_staleness + 1`.
        engine_kwargs: any further `vllm.LLM` keyword arguments (not LoRA's: use `max_lora_rank` / `max_loras`).
    """

    model: str | Path
    dtype: EngineDtype = Field(default_factory=_platform_dtype)
    max_model_len: Annotated[int, Field(ge=16)] = 4096
    kv_cache_gib: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    enforce_eager: bool = True
    seed: int = 0
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    enable_prefix_caching: bool = True
    block_size: Annotated[int, Field(ge=1)] | None = None
    logprobs_mode: Literal["raw", "processed"] = "raw"
    enable_sleep_mode: bool = False
    weight_version: Annotated[int, Field(ge=0)] = 0
    weight_sync: Literal["in_place", "reload"] = "in_place"
    max_lora_rank: StrictInt | None = None
    max_loras: Annotated[StrictInt, Field(ge=1)] = 1
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_lora_rank(cls, value: int | None) -> int | None:
        if value is not None and value not in MAX_LORA_RANKS:
            raise ValueError(f"must be one of vLLM's LoRA ranks {MAX_LORA_RANKS} (or null: no LoRA)")
        return value

    @field_validator("engine_kwargs")
    @classmethod
    def _no_lora_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        lora = sorted(key for key in value if "lora" in key)
        if lora:
            raise ValueError(f"LoRA options {lora} are set by max_lora_rank and max_loras, not engine_kwargs")
        return value

    @field_validator("logprobs_mode", mode="before")
    @classmethod
    def _vllm_logprobs_mode_name(cls, value: Any) -> Any:
        names = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
        return names.get(value, value) if isinstance(value, str) else value


#: KV block size on the CPU, so that a turn's continuation recomputes at most 31 tokens of history the prefix cache
#: cannot hold (vLLM's CPU default is 128). vLLM 0.32's CPU attention backend wants a multiple of 32 for its default
#: kernel and refused 16 here ("No common block size for 16").
_CPU_BLOCK_SIZE = 32


def _on_accelerator() -> bool:
    from ascend.device import current_platform

    return current_platform().is_accelerator


def _llm_kwargs(config: VLLMEngineConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": str(config.model),
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "enforce_eager": config.enforce_eager,
        "seed": config.seed,
        "max_num_seqs": config.max_num_seqs,
        "enable_prefix_caching": config.enable_prefix_caching,
        "logprobs_mode": f"{config.logprobs_mode}_logprobs",
    }
    from ascend.device import current_platform

    platform = current_platform()
    if platform.is_accelerator:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        kwargs["enable_sleep_mode"] = config.enable_sleep_mode
        kwargs.update(platform.engine_kwargs())
    else:
        kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gib * (1 << 30))
        # A seeded request whose prompt is split across engine steps (chunked prefill, once a batch's prompts
        # exceed the step's token budget) makes vLLM rewind its generator, which torch's CPU generators cannot
        # do: the step raises "CPU Generator does not use offset" and every request in flight fails.
        kwargs["enable_chunked_prefill"] = False
        kwargs["block_size"] = _CPU_BLOCK_SIZE
    if config.block_size is not None:
        kwargs["block_size"] = config.block_size
    if config.max_lora_rank is not None:
        # One more adapter in vLLM's CPU-side cache than in use, so that a new adapter loads (and is checked)
        # before the unused old one is removed, and vLLM never evicts one a request in flight still samples with.
        kwargs.update(
            enable_lora=True,
            max_lora_rank=config.max_lora_rank,
            max_loras=config.max_loras,
            max_cpu_loras=config.max_loras + 1,
        )
    kwargs.update(config.engine_kwargs)
    return kwargs


def _set_paused(worker: EngineThread, paused: bool) -> Callable[[Any], None]:
    """A `call` function that pauses (or resumes) the engine thread's stepping; it runs on that thread."""

    def set_paused(llm: Any) -> None:
        worker.paused = paused

    return set_paused


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


class VLLMEngine:
    """An in-process vLLM engine that many coroutines can await at once.

    Use as `async with VLLMEngine(config) as engine:` or call `start()` / `close()`.

    Raises:
        EngineError: from `generate` when the engine is not started, was closed, failed, or rejected the request.
    """

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        # The engine thread's state; the event loop only sends it messages (and reads its weight version).
        adapters = None if config.max_lora_rank is None else AdapterSlots(config.max_loras, config.weight_version)
        self._worker = EngineThread(config.weight_version, adapters)
        self._thread: threading.Thread | None = None
        self._ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._ids = itertools.count()
        self._max_model_len = config.max_model_len
        self._dead: BaseException | None = None
        self._closed = False
        self.last_weight_sync: str | None = None  # how the last weight sync loaded (the path, for logs/tests)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

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
        self._worker.inbox.put(Stop())
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._thread.join)

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
        request_id = str(next(self._ids))
        result: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        self._worker.inbox.put(AddRequest(request_id, list(prompt_ids), options, result))
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
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[Generation | None] = asyncio.Queue()

        def deliver(item: Generation | None) -> None:  # called on the engine thread
            loop.call_soon_threadsafe(deltas.put_nowait, item)

        request_id = str(next(self._ids))
        result: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        result.add_done_callback(lambda _: deliver(None))  # wakes the reader when the request ends or fails
        self._worker.inbox.put(AddRequest(request_id, list(prompt_ids), options, result, deliver))
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
        await self.call(_set_paused(self._worker, True))

    async def resume_generation(self) -> None:
        """Sample again after `pause_generation`: paused and waiting requests continue. Idempotent.

        Raises:
            EngineError: if the engine is not running.
        """
        await self.call(_set_paused(self._worker, False))

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
        source = iter(named_tensors)
        reload = self.config.weight_sync == "reload"

        def load(llm: Any) -> tuple[float, str]:
            t0 = time.perf_counter()
            with counted_casts(f"weight sync to version {self._worker.weight_version + 1}"):
                path = weight_copy.load_weights(llm, source, self._worker.scratch, reload=reload)
            # Both set on the engine thread before its next step and before it takes any further request.
            self._worker.weight_version += 1
            self._worker.stale_cache = not _drop_old_kv(llm)
            return time.perf_counter() - t0, path

        seconds, path = await self.call(load)
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
        if not _on_accelerator():
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
        await self.call(lambda llm: llm.sleep(level=level))
        return True

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Reallocate what `sleep` freed; `tags` `["weights"]` then `["kv_cache"]` lets new weights load in between.

        Returns:
            False (and does nothing) on the CPU or without `enable_sleep_mode`.
        """
        if not self._can_sleep():
            return False
        await self.call(lambda llm: llm.wake_up(tags=tags))
        return True

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(llm)` on the engine thread between two engine steps and return its result.

        In-flight requests stay queued and continue afterwards; this is how weights are swapped in place.

        Raises:
            EngineError: if the engine is not running or `fn` raised (chained).
        """
        self._check_alive()
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._worker.inbox.put(Call(fn, result))
        try:
            return await asyncio.wrap_future(result)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"engine call {getattr(fn, '__name__', fn)!r} failed: {exc}") from exc

    # ---- engine thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        with quiet_vllm():  # vLLM's start-up noise, and its warning at each thread-count change, unless verbose
            self._build_and_serve()

    def _build_and_serve(self) -> None:
        try:
            with counted_casts(f"engine start ({self.config.model})"), quiet_native_stderr():
                from vllm import LLM

                llm = LLM(**_llm_kwargs(self.config))
        except BaseException as exc:  # surfaces in start(); the thread ends
            self._ready.set_exception(exc)
            return
        self._ready.set_result(int(llm.llm_engine.model_config.max_model_len))
        try:
            self._worker.run(llm)
        except BaseException as exc:
            logger.exception("vLLM engine thread failed")
            self._dead = exc
        finally:
            why = "engine closed" if self._dead is None else f"engine failed: {self._dead}"
            self._worker.fail_all(EngineError(why))
            del llm
