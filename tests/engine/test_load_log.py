"""engine.load_log: vLLM's per-tensor dtype-cast warnings counted per loading thread, other records untouched."""

from __future__ import annotations

import logging
import threading

from agentic_rl.engine.load_log import VLLM_LOADER_LOGGER, counted_casts

CAST = "Attempted to load weight %s with dtype %s into parameter with dtype %s"


def test_two_loads_on_two_threads_each_count_their_own_casts(caplog):
    loader = logging.getLogger(VLLM_LOADER_LOGGER)
    reached: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = reached.append
    loader.addHandler(handler)
    inside = threading.Barrier(2)  # both loads are under way before either logs
    counts: dict[str, object] = {}

    def load(name: str, n: int) -> None:
        with counted_casts(name) as casts:
            inside.wait()
            for i in range(n):
                loader.warning(CAST, f"layers.{i}.weight", "torch.float32", "torch.bfloat16")
            loader.warning("another warning from %s", name)
            inside.wait()
        counts[name] = dict(casts)

    try:
        with caplog.at_level(logging.INFO, logger="agentic_rl.engine.load_log"):
            threads = [threading.Thread(target=load, args=(f"load {k}", n)) for k, n in ((0, 3), (1, 5))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        loader.removeHandler(handler)
    pair = ("torch.float32", "torch.bfloat16")
    assert counts == {"load 0": {pair: 3}, "load 1": {pair: 5}}
    assert sorted(r.getMessage() for r in reached) == ["another warning from load 0", "another warning from load 1"]
    lines = sorted(r.getMessage() for r in caplog.records if r.name == "agentic_rl.engine.load_log")
    assert lines == ["load 0: 3 weight tensors stored as torch.float32 served as torch.bfloat16 (the engine's dtype)",
                     "load 1: 5 weight tensors stored as torch.float32 served as torch.bfloat16 (the engine's dtype)"]
    assert not loader.filters  # after the loads, vLLM's records pass as before


def test_quiet_vllm_drops_the_start_up_noise_and_nothing_else(monkeypatch):
    import warnings

    from agentic_rl.engine.load_log import VERBOSE_ENV, quiet_vllm

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    cpu, worker = logging.getLogger("vllm.platforms.cpu"), logging.getLogger("vllm.v1.worker.cpu_worker")
    reached: list[logging.LogRecord] = []  # read at the loggers: once vLLM is imported, its records do not propagate
    handler = logging.Handler(logging.DEBUG)
    handler.emit = reached.append
    for logger in (cpu, worker):
        logger.addHandler(handler)
        monkeypatch.setattr(logger, "level", logging.DEBUG)  # whatever level an earlier engine start left
        monkeypatch.setattr(logger, "filters", [])  # a live engine (another test's) keeps its own quiet filter
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_vllm():
            cpu.warning("Triton is not installed. triton-cpu is expected on x86 CPUs.")
            worker.warning("%s is not found in LD_PRELOAD. For best performance, ...", "libtcmalloc")
            worker.warning("the KV cache does not fit")  # a real problem passes
            warnings.warn_explicit("`reduce_op` is deprecated", FutureWarning, "dispatcher.py", 138,
                                   module="vllm.triton_utils.dispatcher")  # fmt: skip
            warnings.warn_explicit("a user warning", FutureWarning, "mine.py", 1, module="mine")
        cpu.warning("Triton is not installed. triton-cpu is expected on x86 CPUs.")  # after the block: kept
        monkeypatch.setenv(VERBOSE_ENV, "1")
        with quiet_vllm():
            worker.warning("libiomp is not found in LD_PRELOAD.")  # verbose: kept
    for logger in (cpu, worker):
        logger.removeHandler(handler)
    assert [r.getMessage()[:24] for r in reached] == [
        "the KV cache does not fi", "Triton is not installed.", "libiomp is not found in "]  # fmt: skip
    assert [str(w.message) for w in caught] == ["a user warning"]


def test_quiet_native_stderr_drops_noise_lines_of_file_descriptor_2_and_passes_the_rest(capfd, monkeypatch):
    import os

    from agentic_rl.engine.load_log import VERBOSE_ENV, quiet_native_stderr

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    numa = b"[W1202 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation\n"
    with quiet_native_stderr():
        os.write(2, numa + b"kept line\n")
        done = threading.Event()

        def another_start() -> None:  # a second engine starting at the same time shares the filter
            with quiet_native_stderr():
                os.write(2, b"partial ")
            done.set()

        threading.Thread(target=another_start).start()
        done.wait()
        os.write(2, b"end\n")
    os.write(2, numa)  # outside the block: untouched
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with quiet_native_stderr():
        os.write(2, numa)  # verbose: untouched
    assert capfd.readouterr().err == "kept line\npartial end\n" + numa.decode() * 2
