"""One rank of a tensor-parallel engine test (`test_tensor_parallel.py`): `python tp_ranks.py MODEL OUT [T [FAULT]]`.

FAULT `kill` / `stop`: once the engine runs, group rank 1 kills (SIGKILL) or stops (SIGSTOP) itself while its leader
samples without end; the leader must stop with an error naming it.

With WORLD_SIZE > 1 every rank builds its shard of one engine of T ranks per group; each group's leader samples
greedily from 32 fixed prompts, then every rank loads the same new weights, the leader samples again, sends a
request longer than the window (refused), pauses and resumes, and writes what it saw to OUT/rank{R}.json. With
WORLD_SIZE 1 the same, on a plain engine: the reference.
"""

import json
import os
import sys

import anyio
import torch

MODEL, OUT = sys.argv[1], sys.argv[2]
T = int(sys.argv[3]) if len(sys.argv) > 3 else 1
FAULT = sys.argv[4] if len(sys.argv) > 4 else None
PROMPTS = [[int(x) for x in torch.randint(10, 40000, (5 + i % 7,), generator=torch.Generator().manual_seed(i))]
           for i in range(32)]  # fmt: skip
SAMPLING = {"temperature": 0.0, "max_tokens": 12}


def new_weights():
    """The model's weights with every parameter nudged by a fixed, seeded amount (the same on every rank)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return list(model.named_parameters())


async def sample_all(engine):
    results = [None] * len(PROMPTS)

    async def one(i):
        g = await engine.generate(PROMPTS[i], SAMPLING)
        results[i] = {"tokens": g.token_ids, "logprobs": g.logprobs, "versions": g.weight_versions}

    async with anyio.create_task_group() as tg:
        for i in range(len(PROMPTS)):
            tg.start_soon(one, i)
    return results


async def fault(engine, group):
    """Rank 1 of the group dies or stops; the leader samples until its process is stopped."""
    import signal

    if group.rank == 1:
        await anyio.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL if FAULT == "kill" else signal.SIGSTOP)
        await anyio.sleep(3600)
    while True:
        await engine.generate(PROMPTS[0], {"temperature": 1.0, "max_tokens": 64})


async def main():
    from agentic_rl.engine.tensor_parallel import EngineGroup
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.errors import EngineError
    from agentic_rl.train.distributed import init_from_env

    dist = init_from_env("cpu")
    group = None
    if dist.world_size > 1:
        group = EngineGroup.of(T, rank=dist.rank, world_size=dist.world_size, store=dist.store,
                                   timeout_s=10 if FAULT else 60)  # fmt: skip
    config = VLLMEngineConfig(model=MODEL, dtype="float32", max_model_len=256, kv_cache_gib=0.125, seed=0)
    engine = VLLMEngine(config, group=group)
    await engine.start()
    if FAULT is not None:
        await fault(engine, group)
    seen = {"rank": dist.rank}
    leader = group is None or group.is_leader
    if leader:
        seen["before"] = await sample_all(engine)
    else:
        try:
            await engine.generate(PROMPTS[0], SAMPLING)
        except EngineError as exc:
            seen["follower_refused"] = str(exc)
    await engine.update_weights(new_weights())
    seen["version"] = engine.weight_version
    seen["sync"] = engine.last_weight_sync
    if leader:
        seen["after"] = await sample_all(engine)
        try:
            await engine.generate(list(range(10, 400)), SAMPLING)  # longer than the window
        except EngineError as exc:
            seen["refused"] = type(exc).__name__
        await engine.pause_generation()
        async with anyio.create_task_group() as tg:
            box = {}

            async def late():
                box["g"] = await engine.generate(PROMPTS[3], SAMPLING)

            tg.start_soon(late)
            await anyio.sleep(0.2)
            seen["paused_done"] = "g" in box
            await engine.resume_generation()
        seen["after_resume"] = box["g"].token_ids
    await engine.close()
    dist.close()
    with open(os.path.join(OUT, f"rank{dist.rank}.json"), "w") as f:
        json.dump(seen, f)


anyio.run(main)
