"""What vLLM logs while it loads: one line per weight load for its per-tensor dtype casts, and no start-up noise.

vLLM's weight loader warns once per tensor whose stored dtype differs from the engine's ("Attempted to load weight
... with dtype torch.float32 into parameter with dtype torch.bfloat16"): 122 lines for SmolLM2-135M at every engine
start from fp32 weights (the tool model, a training checkpoint) and at every weight sync from an fp32 trainer into a
bf16 engine. Serving in another dtype than the stored one is this project's choice (`VLLMEngineConfig.dtype`), so
`counted_casts` keeps those records out of the log while a load runs and logs one line that counts them.

Every engine start also printed 15 lines or more that say nothing a user can act on: FutureWarnings of vLLM's
modules, the native "NUMA binding" warning, hints to preload tcmalloc / libiomp, "Triton is not installed",
notices about settings this project chose (eager mode, the global seed, chunked prefill), and a warning at each
`torch.set_num_threads` call. `quiet_vllm` drops exactly those (`VLLM_NOISE`) unless `verbose` says otherwise
(``AGENTIC_RL_VERBOSE=1``, which ``agentic-rl -v`` sets); every other record and line passes unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["VERBOSE_ENV", "VLLM_LOADER_LOGGER", "VLLM_NOISE", "counted_casts", "quiet_vllm", "verbose"]

VERBOSE_ENV = "AGENTIC_RL_VERBOSE"
"""Environment variable: ``1`` keeps vLLM's start-up noise (``agentic-rl -v`` sets it)."""
VLLM_NOISE = re.compile(
    "|".join(
        re.escape(text)
        for text in (
            "NUMA binding: Using MEMBIND policy",
            "is not found in LD_PRELOAD",  # libtcmalloc, libiomp
            "Triton is installed, but doesn't include CPU backend",
            "Triton is not installed",
            "requires Triton; using the V1 model runner",
            "doesn't allow to use `torch.set_num_threads` after the thread binding",
            "The global random seed is set to",
            "does not officially support disabling chunked prefill",
            "Enforce eager set, disabling torch.compile",
            # vLLM's reload_weights (a tensor-parallel engine's sync) on layers with no weights of their own: the
            # rotary embedding, and a tied lm_head, which `weight_copy` refreshes from the embedding after it
            "RotaryEmbedding: Failed to load weights",
            "ParallelLMHead: Failed to load weights",
            "Inductor compilation was disabled by user settings",
        )
    )
)
"""The start-up messages `quiet_vllm` drops (a search in a log message or a stderr line)."""
_NOISY_LOGGERS = (
    "vllm.triton_utils.importing",
    "vllm.platforms.cpu",
    "vllm.engine.arg_utils",
    "vllm.config.vllm",
    "vllm.v1.worker.cpu_worker",
)

VLLM_LOADER_LOGGER = "vllm.model_executor.models.utils"
_CAST_MESSAGE = "Attempted to load weight %s with dtype %s into parameter with dtype %s"

logger = logging.getLogger(__name__)


class _CastCounter(logging.Filter):
    """Counts the cast records of one thread (the one loading); records of other threads pass to the next filter."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: Counter[tuple[str, str]] = Counter()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.thread == self.thread
            and record.msg == _CAST_MESSAGE
            and isinstance(record.args, tuple)
            and len(record.args) == 3
        ):
            self.casts[(str(record.args[1]), str(record.args[2]))] += 1
            return False
        return True


@contextmanager
def counted_casts(what: str) -> Iterator[Counter[tuple[str, str]]]:
    """Within the block, vLLM's per-tensor dtype-cast warnings of the calling thread are counted instead of logged;
    on exit one INFO line per (stored dtype, engine dtype) pair says how many tensors `what` cast. Other records
    (and other threads' loads) pass unchanged.

    Yields:
        The counter, keyed by (stored dtype, engine dtype) as vLLM names them (`torch.float32`, ...).
    """
    counter = _CastCounter()
    loader_log = logging.getLogger(VLLM_LOADER_LOGGER)
    loader_log.addFilter(counter)
    try:
        yield counter.casts
    finally:
        loader_log.removeFilter(counter)
        for (stored, served), n in counter.casts.items():
            logger.info("%s: %d weight tensors stored as %s served as %s (the engine's dtype)", what, n, stored, served)


def verbose() -> bool:
    """True when `VERBOSE_ENV` asks for vLLM's full start-up output."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class _Noise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return VLLM_NOISE.search(record.getMessage()) is None


@contextmanager
def quiet_vllm() -> Iterator[None]:
    """Within the block (an engine's life), vLLM's `VLLM_NOISE` records are dropped and its FutureWarnings ignored.

    A no-op when `verbose()`. The warnings filter stays for the process (filters are global, not per thread).
    """
    if verbose():
        yield
        return
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
    noise = _Noise()
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    for log in loggers:
        log.addFilter(noise)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(noise)


@contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Within the block, lines written to file descriptor 2 that match `VLLM_NOISE` are dropped; others pass at once.

    For what native code prints (the C++ "NUMA binding" warning) while an engine starts: file descriptor 2 goes
    through a pipe that a thread copies, line by line, to the real stderr. Blocks of several threads share one
    pipe (the first to enter sets it up, the last to leave restores the real stderr). A no-op when `verbose()`.
    """
    if verbose():
        yield
        return
    with _STDERR_LOCK:
        if not _STDERR_FILTER:
            with contextlib.suppress(OSError):  # without file descriptor 2 (a daemon) nothing is filtered
                _STDERR_FILTER.append(_start_filter())
        if _STDERR_FILTER:
            _STDERR_FILTER[0][0] += 1
        filtering = bool(_STDERR_FILTER)
    if not filtering:
        yield
        return
    try:
        yield
    finally:
        with _STDERR_LOCK:
            _STDERR_FILTER[0][0] -= 1
            if not _STDERR_FILTER[0][0]:
                _stop_filter(*_STDERR_FILTER.pop()[1:])


_STDERR_LOCK = threading.Lock()
_STDERR_FILTER: list[list[Any]] = []  # at most one [users, real stderr fd, pipe read fd, copying thread]


def _start_filter() -> list[Any]:
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    real, (read_fd, write_fd) = os.dup(2), os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    pump = threading.Thread(target=_copy_lines, args=(read_fd, real), name="agentic-rl-stderr-filter", daemon=True)
    pump.start()
    return [0, real, read_fd, pump]


def _stop_filter(real: int, read_fd: int, pump: threading.Thread) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(real, 2)  # closes the pipe's last write end: the thread reads end of file
    pump.join()
    os.close(read_fd)
    os.close(real)


def _copy_lines(read_fd: int, out_fd: int) -> None:
    pending = b""
    while chunk := os.read(read_fd, 65536):
        *lines, pending = re.split(rb"(?<=[\r\n])", pending + chunk)
        _write_kept(out_fd, lines)
    _write_kept(out_fd, [pending])


def _write_kept(out_fd: int, lines: list[bytes]) -> None:
    data = b"".join(line for line in lines if not VLLM_NOISE.search(line.decode("utf-8", "replace")))
    view = memoryview(data)
    with contextlib.suppress(OSError):  # a closed stderr: keep draining the pipe, so that writers never block
        while view:
            view = view[os.write(out_fd, view) :]
