"""The training loop: rollout -> GRPO step -> weight sync into the colocated engine -> next rollout.

Read from the top: `train` (one call, one run), the step loop (`_run_steps`), one step (`_train_step`: the
scheduler's task groups -> one GRPO step -> the new weights into the engine) and what is recorded after it
(`_record_step`). Everything the config says is resolved first, before any folder or engine starts (`loop.plan`:
tasks, system prompt, reward names, classes, engine options); everything set up from it before the first step
(output folder, engine, trainer, scheduler, a resumed checkpoint's state) is `loop.setup`'s, the run's composition
root. With the CLI, the loop package is the only one that imports both `rollout` and `train`. Runs on one process or
under torchrun (one engine per rank, tasks sharded by group, gradients averaged across ranks).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from agentic_rl.loop.config import EngineSection, RolloutSection, TrainConfig, load_run_config, load_train_config
from agentic_rl.loop.engine_groups import Share, engine_group, rollout_context, split_shares
from agentic_rl.loop.memory_plan import measured_line
from agentic_rl.loop.metrics import HELDOUT_COUNTS, StepFigures, gather, heldout_pass_figures, metrics_row
from agentic_rl.loop.plan import plan_run
from agentic_rl.loop.rewards import reward_figures, reward_keys, task_stderr_figures
from agentic_rl.loop.setup import (
    RunState,
    close_engine,
    close_rollout,
    first_redone,
    resume_point,
    set_up,
    starting_point,
)
from agentic_rl.records import write_trajectories
from agentic_rl.train import checkpoints
from agentic_rl.train.checkpoints import weights_digest
from agentic_rl.train.groups import TrajectoryGroup, flatten_groups
from agentic_rl.train.sharded_checkpoints import save_sharded_checkpoint
from agentic_rl.train.step_stats import StepStats

__all__ = [
    "EngineSection",
    "RolloutSection",
    "TrainConfig",
    "load_run_config",
    "load_train_config",
    "resume_point",
    "run_training",
    "train",
    "weights_digest",
]

logger = logging.getLogger(__name__)


def run_training(
    config: TrainConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None, resume: bool = False
) -> list[dict[str, Any]]:
    """Run `config.steps` rollout -> train -> sync iterations in one event loop (`anyio.run(train, ...)`).

    See `train` for what it writes and returns. Call `train` instead from code that already runs an event loop.
    """
    return anyio.run(functools.partial(train, config, on_step=on_step, resume=resume))


async def train(
    config: TrainConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None, resume: bool = False
) -> list[dict[str, Any]]:
    """Run `config.steps` rollout -> train -> sync iterations.

    Everything runs on the caller's event loop: the rollout's trajectories, the engine's weight sync and sleep/wake;
    the GRPO step (CPU/accelerator work) runs in a worker thread so the loop stays responsive.

    Writes under `output_dir` (rank 0): the `loggers` (`metrics.jsonl`, one line per step; `tensorboard/`;
    `wandb/`), `config.json`, `rollouts/step_K.jsonl`, checkpoints (`checkpoints/step_K/` every `checkpoint_every`
    steps, the newest `keep_checkpoints` kept, and `checkpoints/final/`), `reward_curve.png`, `metrics.png` and
    `response_lengths.png` (`write_run_plots`); and every rank writes `weights_rank{R}.sha256` with its final
    weights' digest and `task_ids_rank{R}.jsonl` (one line per step: the ids of the tasks it trained,
    `{"step", "task_ids"}`, and with `rollout.dynamic_sampling` the idle ones it left out,
    `ContinuousRollout.step_record`; their trajectories go to `rollouts/step_K_left_out.jsonl`).

    A checkpoint holds the model (with `optimizer.lora`, its adapter only), the tokenizer and the training state
    (`RunState.training_state`: optimizer, steps, task order position, weight version, RNG states, metrics rows),
    written atomically (a kill leaves the previous one intact). Each step's rollout is seeded by the config, the rank
    and the step, so a resumed run repeats the uninterrupted one. Each metrics row (`metrics_row`) holds the step's
    rewards, losses, timings and token accounting summed over ranks (`tokens_sampled` = `tokens_trained` +
    `tokens_excluded`), and `step_skipped` / `skipped_steps` (optimizer steps skipped for a non-finite gradient norm).

    Args:
        config: the run.
        on_step: called with each step's metrics row (of the steps this call runs).
        resume: continue the run in `output_dir` from its newest complete checkpoint (`resume_point`; none: start
            over): the model, optimizer, step, RNG states, task order, weight version and metrics rows come back,
            the engine starts from the checkpoint's weights, `metrics.jsonl` keeps the rows of the steps up to it,
            TensorBoard purges later events, wandb continues the same run id. Without it, `output_dir` must not
            hold an earlier run's `metrics.jsonl` or `checkpoints/`. A run resumed after its last step returns its
            rows and starts no engine.

    Returns:
        The metrics of every step (rank 0's view, aggregated over ranks), those before a resume included.

    Raises:
        ConfigError: when `config` fails its checks (run anew: a value assigned inside a section is checked against
            the whole run), starting a new run over an earlier one, resuming a checkpoint of another world size, or
            what the config names cannot be had (`plan_run`: tasks, reward, classes; before any engine starts).
        TrainingError: when `optimizer.max_consecutive_skips` optimizer steps in a row were skipped.
    """
    from agentic_rl.train.distributed import init_from_env
    from agentic_rl.train.loggers import build_loggers

    config = config.checked()
    dist = init_from_env(config.device)
    group = engine_group(config, dist)
    start, state, done = starting_point(config, dist, resume=resume)
    if done:  # nothing to redo: no engine to start
        logger.info("%s finished all %d steps already (%s)", config.output_dir, config.steps, start.path)
        dist.close()
        return list(state["history"])
    plan = plan_run(config, dist.rank, dist.world_size, state)  # what the config says, before any folder or engine
    run = await set_up(plan, dist, start, state, resume=resume, group=group)
    try:
        if dist.is_main:
            run.sinks.extend(
                build_loggers(
                    config.loggers,
                    run.out,
                    config=config.model_dump(),
                    wandb_project=config.wandb_project,
                    resume_from=first_redone(state) if resume else None,
                )
            )
        if state is not None:  # last, so that nothing set up since draws from the restored generators
            checkpoints.restore_rng_state(state["rng"])
        if run.eval_tasks and state is None:
            _log(run, {"step": 0, **await _evaluate(run, run.out / "rollouts" / "eval_step_0.jsonl")}, step=0)
        await _run_steps(run, on_step)
        _finish(run)
        dist.close()  # every rank got here: leave the training group before the interpreter shuts down
    finally:
        await _tear_down(run)
    return run.history


async def _tear_down(run: RunState) -> None:
    """Close what the run started: its metric sinks, the rollout (bounded: `close_rollout`), the engine (always,
    even when the rollout hangs or fails to close) and the weight sync's folders. Never raises (each failure is
    logged) and is shielded from cancellation, so that it neither masks a failed run's error nor fails a finished
    run."""
    with anyio.CancelScope(shield=True):
        for sink in run.sinks:
            try:
                sink.close()
            except Exception:
                logger.exception("closing the metric sink %s failed", type(sink).__name__)
        await close_rollout(run.rollout)
        await close_engine(run.engine)
        if run.handoff is not None:
            run.handoff.close()
        run.trainer.close()
        try:
            run.sync.close()
        except Exception:
            logger.exception("removing the weight sync's folders failed")


async def _run_steps(run: RunState, on_step: Callable[[dict[str, Any]], None] | None) -> None:
    """Steps `run.done` ... `config.steps - 1`, with the rollout's batches admitted in the background meanwhile."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(run.feed.serve)
        mark = time.perf_counter()
        for step in range(run.done, run.config.steps):
            figures = await _train_step(run, step, mark)
            if step == run.done and run.memory_plan is not None and run.dist.is_main:
                logger.info(measured_line(run.memory_plan))  # what the first step took, beside the plan
            mark = time.perf_counter()
            row = metrics_row(
                run.dist,
                step,
                figures,
                weight_version=run.engine.weight_version,
                max_staleness=run.config.rollout.max_staleness,
            )
            row.update(reward_figures(run.dist, figures.trajectories, reward_keys(run.config)))
            await _record_step(run, step, row, figures)
            if on_step is not None:
                on_step(row)
        tg.cancel_scope.cancel()


async def _train_step(run: RunState, step: int, started: float) -> StepFigures:
    """Training step `step` (0-based) on this rank: wait for its task groups (`ContinuousRollout.next_step`; in
    lockstep, the whole rollout), refuse what cannot be trained (stale groups, records the engine did not sample),
    then one GRPO step on the groups and the new weights into the engine (`_train_and_sync`). Their task ids go to
    the task ids file, in training order."""
    t0 = time.perf_counter()
    feed, wanted = run.feed, run.config.rollout.tasks_per_step * (run.group.size if run.group else 1)
    finished = lambda: min(sum(g.finished for g in list(feed.groups)), wanted)  # noqa: E731 (read by the heartbeat)
    with _heartbeat(run, f"step {step + 1} rollout", wanted, finished, unit="groups"):
        groups, dropped, refused = await _step_groups(run, step)
    rollout_s = time.perf_counter() - t0
    with run.task_ids.open("a") as f:
        f.write(json.dumps(run.feed.step_record(step, groups, _task_id), default=str) + "\n")
    trajectories, _ = flatten_groups(groups)
    if all(t.failed for t in trajectories):  # each says why in its `error` (rollouts/step_K.jsonl)
        logger.warning("step %d: every trajectory of this rank failed or was refused: none trains", step + 1)
    stats, sync_s = await _train_and_sync(run, groups)
    if run.rollout is not None:
        run.rollout.ledger.forget_before(run.engine.weight_version - run.config.rollout.max_staleness)  # untrainable
    run.feed.step_done()
    failed = sum(g.failed for g in groups) - dropped  # every sample failed or was refused, other than as stale
    counts = {
        "trained": len(groups) - dropped - failed,
        "failed": failed,
        "dropped_stale": dropped,
        "in_flight": len(run.feed.groups),
        **run.feed.step_counts,
    }
    return StepFigures(
        trajectories=trajectories,
        refused=refused,
        stats=stats,
        rollout_s=rollout_s,
        sync_s=sync_s,
        step_s=time.perf_counter() - started,
        groups=counts,
        task_ids=_task_ids(groups),
        left_out=flatten_groups(run.feed.constant)[0],
        left_out_task_ids=_task_ids(run.feed.constant),
    )


async def _step_groups(run: RunState, step: int) -> Share:
    """This rank's task groups of step `step`, those dropped as stale and the trajectories refused (records the
    engine did not sample). With tensor-parallel engines the group's leader waits for the group's, checks them and
    hands each rank its share (`loop.engine_groups`); a follower receives its share."""
    from agentic_rl.loop.scheduler import drop_stale_groups
    from agentic_rl.loop.sources import refuse_lone_samples, refuse_untrainable

    if run.rollout is None:
        return await run.feed.receive()
    groups = await run.feed.next_step(step)
    size, per_rank = (run.group.size, run.config.rollout.tasks_per_step) if run.group else (1, len(groups))
    shares: list[Share] = []
    for share in split_shares(groups, size, per_rank):
        dropped = drop_stale_groups(share, run.engine.weight_version, run.config.rollout.max_staleness)
        refused = refuse_untrainable(flatten_groups(share)[0], run.rollout.ledger) + refuse_lone_samples(share)
        shares.append((share, dropped, refused))
    return await run.handoff.hand_out(shares) if run.handoff is not None else shares[0]


async def _train_and_sync(run: RunState, groups: list[TrajectoryGroup]) -> tuple[StepStats, float]:
    """One GRPO step on `groups` (each a GRPO group) in a worker thread, then the new weights into the engine
    (asleep during the GRPO step when `engine.sleep_while_training`; generation paused during it with the `pause`
    placement, running on with `overlap`).

    Returns:
        The step's statistics, and the seconds of the weight sync (and waking the engine).
    """
    config = run.config
    sleep = config.engine.sleep_while_training
    pause = config.rollout.placement == "pause" and config.rollout.max_staleness > 0  # lockstep has nothing to pause
    if pause:
        await run.engine.pause_generation()
    if sleep:
        await run.engine.sleep()
    train = functools.partial(run.trainer.train_step, groups, weight_version=run.engine.weight_version)
    stats = await anyio.to_thread.run_sync(train)
    t0 = time.perf_counter()
    if sleep:
        await run.engine.wake_up(["weights"])
    await run.sync.push()
    if sleep:
        await run.engine.wake_up(["kv_cache"])
    if pause:
        await run.engine.resume_generation()
    return stats, time.perf_counter() - t0


async def _record_step(run: RunState, step: int, row: dict[str, Any], figures: StepFigures) -> None:
    """After step `step` (0-based): evaluate when due (every `eval_every` steps and after the last; into `row`), keep
    the row, and (rank 0) log it, write the step's trajectories and, every `checkpoint_every` steps, a checkpoint
    (sharded: written by every rank, `_save_checkpoint`)."""
    config, done = run.config, step + 1
    if run.eval_tasks and (done == config.steps or (config.eval_every and done % config.eval_every == 0)):
        row.update(await _evaluate(run, run.out / "rollouts" / f"eval_step_{done}.jsonl"))
    run.history.append(row)
    if run.dist.is_main:
        _log(run, row, step=done)
        write_trajectories(run.out / "rollouts" / f"step_{done}.jsonl", figures.trajectories, figures.task_ids)
        left_out = run.out / "rollouts" / f"step_{done}_left_out.jsonl"
        if figures.left_out:  # what dynamic sampling left out: sampled, never trained
            write_trajectories(left_out, figures.left_out, figures.left_out_task_ids)
        else:  # a step redone after a resume may leave out what the first try did not
            left_out.unlink(missing_ok=True)
    if config.checkpoint_every and done % config.checkpoint_every == 0:
        _save_checkpoint(run, f"step_{done}", done)  # rank 0, or every rank of a sharded trainer
        if run.dist.is_main:
            checkpoints.prune_checkpoints(run.out / "checkpoints", config.keep_checkpoints)


def _finish(run: RunState) -> None:
    """After the last step: (rank 0; sharded, every rank) the final checkpoint, unless the run resumed from it, and
    (rank 0) the plots; then this rank's weights digest."""
    from agentic_rl.train.plots import write_run_plots

    if run.start is None or run.start.path.name != checkpoints.FINAL:
        _save_checkpoint(run, checkpoints.FINAL, run.config.steps)
    if run.dist.is_main:
        write_run_plots(run.out)
    (run.out / f"weights_rank{run.dist.rank}.sha256").write_text(weights_digest(run.trainer.module) + "\n")


def _log(run: RunState, row: dict[str, Any], *, step: int) -> None:
    """Hand `row` to every metric sink (rank 0's; the other ranks have none)."""
    for sink in run.sinks:
        sink.log(row, step=step)


async def _evaluate(run: RunState, records: Path) -> dict[str, float | None]:
    """Greedy (or `eval_temperature`) rollout of the held-out tasks through the same rollout path (this rank's
    shard; ranks gathered), `eval_samples` (K) samples of each task (task-major: this rank's trajectory
    i * K + s is sample s of its task i, and its index offsets its seed, so each sample draws its own and every
    evaluation draws alike), its trajectories written (rank 0's) to `records`.

    Returns:
        `heldout_accuracy` (share of all samples with a positive task reward: with the LLM judge, the judge's
        accuracy), `heldout_tool_call_rate`, `heldout_mean_turns`; with K > 1, `heldout_pass@k` for k = 1..K,
        `heldout_avg@K` and `heldout_accuracy_stderr` (`heldout_pass_figures`); `reward_figures` prefixed
        `heldout_` (e.g. `heldout_hotpotqa_f1`, `heldout_judge_failures`), each average with its standard error
        over tasks (`heldout_hotpotqa_f1_stderr`: `task_stderr_figures`).
    """
    from agentic_rl.rewards.passk import sample_correct
    from agentic_rl.train.distributed import shard

    k = run.config.eval_samples
    trajectories = []  # a follower of a tensor-parallel engine evaluates nothing: its leader does the group's share
    if run.rollout is not None:
        tasks = [task for task in shard(run.eval_tasks, rollout_context(run.dist, run.group)) for _ in range(k)]
        done = [0]
        with _heartbeat(run, "held-out evaluation", len(tasks), lambda: done[0]):
            trajectories = await run.rollout.run(tasks, run.eval_sampling, on_result=lambda _: _count(done))
    correct = [sample_correct(t.metrics) for t in trajectories]
    local = {
        "solved": float(sum(correct)),
        "with_tool_calls": float(sum(t.metrics.get("tool_calls", 0) > 0 for t in trajectories)),
        "turns": float(sum(t.metrics.get("steps", 0) for t in trajectories)),
        "trajectories": float(len(trajectories)),
    }
    totals = {key: sum(values) for key, values in gather(run.dist, HELDOUT_COUNTS, local).items()}
    n = max(totals["trajectories"], 1.0)
    if run.dist.is_main:
        write_trajectories(records, trajectories)
    by_task = [correct[i : i + k] for i in range(0, len(correct), k)]
    return {
        "heldout_accuracy": totals["solved"] / n,
        "heldout_tool_call_rate": totals["with_tool_calls"] / n,
        "heldout_mean_turns": totals["turns"] / n,
        **(heldout_pass_figures(run.dist, by_task, k) if k > 1 else {}),
        **reward_figures(run.dist, trajectories, reward_keys(run.config), prefix="heldout_"),
        **task_stderr_figures(run.dist, trajectories, reward_keys(run.config), k),
    }


def _heartbeat(run: RunState, label: str, total: int, done: Callable[[], int], *, unit: str = "trajectories") -> Any:
    """A line every 30 s while a long phase runs on rank 0 (`progress.Heartbeat`); nothing on the other ranks."""
    from agentic_rl.progress import Heartbeat

    if not run.dist.is_main or run.rollout is None:
        return contextlib.nullcontext()
    return Heartbeat(label, total, done, unit=unit)


def _count(box: list[int]) -> None:
    box[0] += 1


def _save_checkpoint(run: RunState, name: str, step: int) -> None:
    """Save `checkpoints/<name>/` after `step` steps: the model (or its LoRA adapter: peft's `save_pretrained` of the
    trainer's module), the tokenizer and the training state (`RunState.training_state`, with every rank's pending
    groups, gathered first), by rank 0. A sharded trainer's checkpoint is written by every rank, each its own shards
    (`train.sharded_checkpoints`). Every rank calls this."""
    folder = run.out / "checkpoints" / name
    rollouts = run.dist.gather_objects(run.feed.checkpoint())  # every rank's pending groups: a collective
    if run.trainer.sharded:
        save_sharded_checkpoint(folder, run.trainer, run.tokenizer, run.training_state(step, rollouts))
    elif run.dist.is_main:
        checkpoints.save_checkpoint(folder, run.trainer.module, run.tokenizer, run.training_state(step, rollouts))


def _task_id(task: Any) -> Any:
    return task.get("id") if isinstance(task, dict) else None


def _task_ids(groups: Sequence[TrajectoryGroup]) -> list[Any]:
    """The task id of each trajectory of `groups`, in their order."""
    return [_task_id(g.task) for g in groups for _ in g.samples]
