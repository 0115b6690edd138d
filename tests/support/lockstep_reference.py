"""A lockstep training loop written out by hand over a training run's own parts (engine, rollout, trainer, task
order, per-step sampling), to check that `agentic-rl train` with `rollout.max_staleness: 0` is exactly it.

    python tests/support/lockstep_reference.py CONFIG OUT_JSON

Writes `{"rows": [{"loss", "reward_mean", "grad_norm", "tokens_trained"} per step], "digest": final weights}`.
"""

from __future__ import annotations

import json
import sys

import anyio

from agentic_rl.loop.plan import plan_run
from agentic_rl.loop.run import load_train_config, weights_digest
from agentic_rl.loop.setup import set_up, step_sampling
from agentic_rl.loop.sources import refuse_untrainable
from agentic_rl.train.distributed import init_from_env, shard


async def lockstep(config_path: str) -> dict:
    config = load_train_config(config_path)
    dist = init_from_env(config.device)
    run = await set_up(plan_run(config, dist.rank, dist.world_size, None), dist, None, None, resume=False)
    size = config.rollout.group_size
    rows = []
    try:
        for step in range(config.steps):  # roll out the whole batch, train on it, sync: nothing overlaps
            tasks = [dict(t) for t in shard(run.task_order.next_batch(), dist) for _ in range(size)]
            run.rollout.ledger.clear()
            trajectories = await run.rollout.run(tasks, step_sampling(config, dist.rank, step))
            refuse_untrainable(trajectories, run.rollout.ledger)
            stats = run.trainer.train_step(trajectories, group_ids=[i // size for i in range(len(trajectories))],
                                           weight_version=run.engine.weight_version).as_metrics()  # fmt: skip
            await run.engine.update_weights(run.trainer.named_weights())
            rows.append({key: stats[key] for key in ("loss", "reward_mean", "grad_norm", "tokens_trained")})
    finally:
        await run.rollout.aclose()
        await run.engine.close()
    return {"rows": rows, "digest": weights_digest(run.trainer.module)}


if __name__ == "__main__":
    result = anyio.run(lockstep, sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
