"""The order of a step with `engine.sleep_while_training` (vLLM's sleep mode, an accelerator feature: on the CPU the
engine only logs that it skips it). vLLM documents it for RL weight updates: sleep during training, wake the weights
alone, load the new weights, then wake the KV cache, so that the weights and the KV cache are never both allocated
while the trainer holds its gradients and optimizer state. The engine here records the calls it gets, in place of a
GPU engine (the loop's side is what is tested)."""

from __future__ import annotations

import types

import anyio
from support.train_runs import write_train_config

from agentic_rl.loop import load_train_config
from agentic_rl.loop.run import _train_and_sync


class RecordingEngine:
    """Records the loop's calls; `update_weights` reads its source as a sharded trainer's sync requires (whole)."""

    def __init__(self, calls: list) -> None:
        self.calls, self.weight_version = calls, 0

    async def sleep(self, level: int = 1) -> bool:
        self.calls.append("sleep")
        return True

    async def wake_up(self, tags=None) -> bool:
        self.calls.append(("wake_up", tuple(tags or ())))
        return True

    async def update_weights(self, named_tensors) -> float:
        self.calls.append(("update_weights", [name for name, _ in named_tensors]))
        self.weight_version += 1
        return 0.0


def test_a_sleeping_engine_wakes_its_weights_takes_the_new_ones_then_wakes_its_kv_cache(tmp_path):
    calls: list = []
    config = load_train_config(write_train_config(tmp_path), ["engine.sleep_while_training=true"])
    engine = RecordingEngine(calls)

    class Trainer:
        def train_step(self, groups, *, weight_version):
            calls.append(("train_step", weight_version))
            return "stats"

    class Sync:
        async def push(self):
            await engine.update_weights([("model.embed_tokens.weight", None), ("model.norm.weight", None)])

    run = types.SimpleNamespace(config=config, engine=engine, trainer=Trainer(), sync=Sync())
    stats, _ = anyio.run(_train_and_sync, run, [])
    assert stats == "stats"
    assert calls == ["sleep", ("train_step", 0), ("wake_up", ("weights",)),
                     ("update_weights", ["model.embed_tokens.weight", "model.norm.weight"]),
                     ("wake_up", ("kv_cache",))]  # fmt: skip
