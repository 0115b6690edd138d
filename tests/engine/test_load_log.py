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
