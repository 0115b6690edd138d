"""The training loop: rollout -> GRPO step -> weight sync into the colocated engine -> next rollout.

With the CLI, the only module that imports both `rollout` and `train`. Runs on one process or under torchrun
(one engine per rank, tasks sharded by group, gradients averaged across ranks).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from agentic_rl.engine.base import PausableEngine, TrainableEngine
from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import (
    EngineSection,
    RolloutSection,
    TrainConfig,
    config_tasks,
    load_run_config,
    load_train_config,
    system_prompt,
)
from agentic_rl.loop.metrics import HELDOUT_COUNTS, StepFigures, gather, metrics_row
from agentic_rl.loop.rewards import check_reward, reward_figures, reward_keys, train_reward
from agentic_rl.loop.weight_sync import WeightSync, lora_engine_options, restore_weights
from agentic_rl.train import checkpoints
from agentic_rl.train.checkpoints import Checkpoint, weights_digest
from agentic_rl.types import write_trajectories

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


def resume_point(config: TrainConfig) -> Checkpoint | None:
    """The checkpoint `train(config, resume=True)` continues from: the newest complete one under
    `output_dir/checkpoints` (None: it starts over)."""
    return checkpoints.latest_checkpoint(Path(config.output_dir) / "checkpoints", final_step=config.steps)


def _check_fresh(out: Path) -> None:
    """Refuse to start a new run over an earlier one's metrics or checkpoints (they would mix, or be replaced).

    Raises:
        ConfigError: naming what is there and the way out.
    """
    earlier = [name for name in ("metrics.jsonl", "checkpoints") if (out / name).exists()]
    if earlier:
        raise ConfigError(
            f"{out} already holds a training run ({', '.join(earlier)}): continue it with "
            f"'agentic-rl train --resume {out}', or choose another output_dir"
        )


def _task_id(task: Any) -> Any:
    return task.get("id") if isinstance(task, dict) else None


def _task_ids(groups: Any) -> list[Any]:
    """The task id of each trajectory of `groups`, in their order."""
    return [_task_id(g.task) for g in groups for _ in g.trajectories]


class _TaskOrder:
    """`per_step` tasks at a time from a seeded shuffle, cycling; `position` counts the tasks handed out (what a
    resumed run restores)."""

    def __init__(self, tasks: list[dict[str, Any]], per_step: int, seed: int) -> None:
        self.tasks = tasks
        self.per_step = per_step
        self.order = list(range(len(tasks)))
        random.Random(seed).shuffle(self.order)
        self.position = 0

    def next_batch(self) -> list[dict[str, Any]]:
        batch = [self.tasks[self.order[(self.position + i) % len(self.order)]] for i in range(self.per_step)]
        self.position += self.per_step
        return batch


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
    `{"step", "task_ids"}`, and with `rollout.dynamic_sampling` the idle ones it left out, `ContinuousRollout.step_record`;
    their trajectories go to `rollouts/step_K_left_out.jsonl`).

    A checkpoint holds the model (with `optimizer.lora`, its adapter only), the tokenizer and the training state
    (`_state`: optimizer, steps, task order position, weight version, RNG states, metrics rows), written
    atomically: a kill at any moment leaves the previous one intact. Each step's rollout is sampled with a seed fixed
    by the config, the rank and the step, so a resumed run repeats the uninterrupted one. Each metrics row
    (`_metrics_row`) holds the step's rewards, losses, timings and token accounting summed over ranks
    (`tokens_sampled` = `tokens_trained` + `tokens_excluded`), and `step_skipped` / `skipped_steps` (optimizer
    steps skipped for a non-finite gradient norm).

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
            the whole run here), starting a new run over an earlier one, resuming a checkpoint of another world
            size, or `data` / `eval_data` gives no tasks (checked before the engine starts).
        TrainingError: when `optimizer.max_consecutive_skips` optimizer steps in a row were skipped.
    """
    from agentic_rl.train.distributed import init_from_env
    from agentic_rl.train.loggers import build_loggers

    config = config.checked()
    dist = init_from_env(config.device)
    start, state = _starting_point(config, dist, resume=resume)
    if _finished(Path(config.output_dir), start, dist.world_size):  # nothing to redo: no engine to start
        logger.info("%s finished all %d steps already (%s)", config.output_dir, config.steps, start.path)
        return list(state["history"])
    run = await _set_up(config, dist, start, state, resume=resume)
    try:
        if dist.is_main:
            run.sinks.extend(
                build_loggers(
                    config.loggers,
                    run.out,
                    config=config.model_dump(),
                    wandb_project=config.wandb_project,
                    resume_from=_first_redone(state) if resume else None,
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
        for sink in run.sinks:
            sink.close()
        try:
            await run.rollout.aclose()
        finally:
            await run.engine.close()
            run.sync.close()
    return run.history


@dataclass(slots=True)
class _Run:
    """What a training run holds from its set-up (`_set_up`) to its end."""

    config: TrainConfig
    dist: Any  # a DistContext: this process's rank among `world_size`
    out: Path  # config.output_dir
    start: Checkpoint | None  # the checkpoint it resumed from (None: from the start)
    done: int  # steps done before this call (the checkpoint's step; 0 from the start)
    eval_tasks: list[dict[str, Any]]  # held-out tasks (empty: no evaluation)
    task_order: _TaskOrder  # the training tasks, in the order the steps take them
    task_ids: Path  # task_ids_rank{R}.jsonl
    tokenizer: Any
    trainer: Any  # a GRPOTrainer
    engine: TrainableEngine
    sync: WeightSync  # how the trainer's weights (or LoRA adapter) reach the engine
    rollout: Any  # the `TrainingRollout` every rollout of the run goes through (`_start_rollouts`), closed at the end
    feed: Any  # the `ContinuousRollout` that hands the steps their groups (`_feed`)
    sinks: list[Any]  # rank 0's metric sinks (`build_loggers`), filled when the run starts
    history: list[dict[str, Any]]  # the metrics rows so far


async def _set_up(
    config: TrainConfig, dist: Any, start: Checkpoint | None, state: dict[str, Any] | None, *, resume: bool
) -> _Run:
    """Everything a run needs before its first step, in this order: the tasks (read before any folder or engine
    starts), `output_dir`, the rollout machinery and the trainer. Resuming, the checkpoint's `state` comes back (all
    but the RNG states, which `train` restores last); otherwise, on several ranks, every engine loads rank 0's
    weights, like the trainers (a resumed run's engines all load the same checkpoint)."""
    import torch
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    if config.rollout.dynamic_sampling and dist.world_size > 1:  # each rank would draw its own extra tasks
        raise ConfigError(f"rollout.dynamic_sampling runs on one rank only, not {dist.world_size}")
    tasks = config_tasks(config, "data")
    eval_tasks = config_tasks(config, "eval_data", limit=config.eval_limit) if config.eval_data else []
    device = _local_device(config.device)
    torch.manual_seed(config.seed)
    out = Path(config.output_dir)
    task_ids = _prepare_output(config, dist, _first_redone(state), resume=resume)
    model_dir = await anyio.to_thread.run_sync(resolve_model, config.model)  # may build it: off the event loop
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    task_order = _TaskOrder(tasks, config.rollout.tasks_per_step * dist.world_size, config.seed)
    rollout, engine = await _start_rollouts(config, dist, tokenizer, model_dir, start, state)
    trainer = _make_trainer(config, dist, tokenizer, model_dir, device)
    history: list[dict[str, Any]] = []
    if state is not None:  # after the trainer copied the initial model as its KL reference
        restore_weights(trainer, start.path, state)
        task_order.position = state["task_position"]
        history = list(state["history"])
    sync = WeightSync.of(config, trainer, engine)
    await sync.at_start(resumed=state is not None, world_size=dist.world_size)
    run = _Run(
        config=config,
        dist=dist,
        out=out,
        start=start,
        done=state["step"] if state is not None else 0,
        eval_tasks=eval_tasks,
        task_order=task_order,
        task_ids=task_ids,
        tokenizer=tokenizer,
        trainer=trainer,
        engine=engine,
        sync=sync,
        rollout=rollout,
        feed=None,
        sinks=[],
        history=history,
    )
    run.feed = _feed(run, state)
    return run


def _first_redone(state: dict[str, Any] | None) -> int:
    """The first step (1-based) a run resumed from `state` redoes: rows of it and later ones are dropped from the
    per-step files (0 without a state: all are)."""
    return state["step"] + 1 if state is not None else 0


def _local_device(device: str) -> Any:
    """The trainer's device: one accelerator per local rank (`cuda` / `npu`, made the current one), else `device`."""
    if device not in ("cuda", "npu"):
        return device
    from ascend.device import Platform

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local = Platform(device).device(local_rank)
    Platform(device).set_device(local_rank)
    return local


def _prepare_output(config: TrainConfig, dist: Any, first_redone: int, *, resume: bool) -> Path:
    """Make `output_dir` (and, rank 0, `rollouts/` and, for a new run, `config.json`), and cut this rank's task ids
    file back to the steps before `first_redone` (a resumed run redoes the later steps).

    Returns:
        The task ids file, `task_ids_rank{R}.jsonl`.
    """
    from agentic_rl.train.loggers import keep_steps_before

    out = Path(config.output_dir)
    if dist.is_main:
        (out / "rollouts").mkdir(parents=True, exist_ok=True)
        if not resume:
            (out / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    task_ids = out / f"task_ids_rank{dist.rank}.jsonl"
    keep_steps_before(task_ids, first_redone)
    return task_ids


def _engine_options(config: TrainConfig, dist: Any, model_dir: Path, state: dict[str, Any] | None) -> dict[str, Any]:
    """The colocated engine's options: the config's dtype, KV cache and window, seeded per rank, able to sleep when
    `sleep_while_training`; resuming, it starts at the checkpoint's weight version."""
    engine = config.engine
    options: dict[str, Any] = {
        "dtype": engine.dtype,
        "kv_cache_gib": engine.kv_cache_gib,
        "seed": config.seed + dist.rank,
        "enable_sleep_mode": engine.sleep_while_training,
    }
    if engine.max_model_len:
        options["max_model_len"] = engine.max_model_len
    if _distribution(config) is not None:  # the sampled token's logprob under the distribution it was drawn from
        options["logprobs_mode"] = "processed"
    if state is not None:  # the engine starts from the checkpoint's weights (fp32), at their version
        options["weight_version"] = state["weight_version"]
        if engine.dtype == "auto":  # the dtype the model's own folder asks for, as in the first process
            from transformers import AutoConfig

            wanted = getattr(AutoConfig.from_pretrained(str(model_dir)), "dtype", None)
            options["dtype"] = str(wanted).removeprefix("torch.") if wanted else "auto"
    return {**options, **lora_engine_options(config, state)}


async def _start_rollouts(
    config: TrainConfig,
    dist: Any,
    tokenizer: Any,
    model_dir: Path,
    start: Checkpoint | None,
    state: dict[str, Any] | None,
) -> tuple[Any, TrainableEngine]:
    """Start what the run's rollouts share: the chat renderer (its template checked first), a colocated engine
    (`_engine_options`, the checkpoint's weights when resuming) and the `TrainingRollout` over it
    (`build_training_rollout`: the built-in tool agent, a user's `environment` or a user's `agent`, whose classes are
    loaded before the engine starts). `train` closes both.

    Returns:
        The rollout and its engine.

    Raises:
        ConfigError: if the engine cannot take new weights, or a class the config names cannot be loaded or built.
    """
    from agentic_rl.chat import ChatRenderer
    from agentic_rl.loop.sources import build_training_rollout, load_classes
    from agentic_rl.rollout.agent import start_engine
    from agentic_rl.rollout.spec import HarnessConfig

    r = config.rollout
    harness = HarnessConfig(
        max_steps=r.max_steps,
        max_prompt_length=r.max_prompt_length,
        max_response_length=r.max_response_length,
        sampling=r.sampling,
        toolcall_weight=r.toolcall_weight,
        milestone_weight=r.milestone_weight,
        unfinished_penalty=r.unfinished_penalty,
        reward_timeout_s=r.reward_timeout_s,
    )
    renderer = ChatRenderer(tokenizer)
    check_reward(config)
    prompt = system_prompt(config)
    load_classes(tools=config.tools, environment=config.environment, agent=config.agent)
    weights = start.path if start is not None and config.optimizer.lora is None else model_dir  # LoRA: the base
    engine = start_engine(
        weights,
        _engine_options(config, dist, model_dir, state),
        max_prompt_length=r.max_prompt_length,
        max_response_length=r.max_response_length,
    )
    try:
        if not isinstance(engine, TrainableEngine):
            raise ConfigError(f"training needs an engine that takes new weights, got {type(engine).__name__}")
        if r.max_staleness and r.placement == "pause" and not isinstance(engine, PausableEngine):
            raise ConfigError(
                f"rollout.placement 'pause' needs an engine that can pause generation, got "
                f"{type(engine).__name__}: use placement 'overlap'"
            )
        reward_fn = train_reward(config, engine, renderer)  # the in-process judge asks this engine
        rollout = build_training_rollout(
            engine,
            renderer,
            tokenizer,
            harness=harness,
            n_parallel_agents=r.n_parallel_agents,
            tools=config.tools,
            reward_fn=reward_fn,
            environment=config.environment,
            agent=config.agent,
            system_prompt=prompt,
        )
    except BaseException:
        with anyio.CancelScope(shield=True):
            await engine.close()
        raise
    return rollout, engine


def _sampling(run: _Run, step: int | None) -> Any:
    """The sampling options of training step `step`'s rollout (0-based: the config's, with the seed
    `derive_seed(config.seed, rank, step)`, which the turn loop offsets per trajectory and turn, so a resumed run
    samples what the uninterrupted one would have), or with `step=None` the held-out evaluation's (greedy and
    unseeded; or at `config.eval_temperature` with a seed of its own (`step=-1`: no training step's), the same at
    every evaluation)."""
    from agentic_rl.engine.sampling import derive_seed

    if step is None:
        temperature = run.config.eval_temperature
        seed = derive_seed(run.config.seed, rank=run.dist.rank, step=-1) if temperature else None  # no step's seed
        update: dict[str, Any] = {"temperature": temperature, "seed": seed}
    else:
        update = {"seed": derive_seed(run.config.seed, rank=run.dist.rank, step=step)}
    return run.config.rollout.sampling.model_copy(update=update)


def _make_trainer(config: TrainConfig, dist: Any, tokenizer: Any, model_dir: Path, device: Any) -> Any:
    """A `GRPOTrainer` of the fp32 model on `device` (the trainer copies it as its KL reference); a cosine schedule
    without `lr_decay_steps` decays over the run's `steps`."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.train.trainer import GRPOTrainer

    optimizer = config.optimizer
    if optimizer.lr_schedule == "cosine" and optimizer.lr_decay_steps is None:
        optimizer = optimizer.model_copy(update={"lr_decay_steps": config.steps})  # the cosine spans the run
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    return GRPOTrainer(
        model, pad_token_id=tokenizer.pad_token_id, config=optimizer, dist=dist, sampling=_distribution(config)
    )


def _distribution(config: TrainConfig) -> Any:
    """The distribution the rollout samples from (temperature, top-k, top-p), which the trainer's logprobs follow
    and the engine reports processed logprobs of; None for plain sampling (temperature 1, no truncation), where
    the raw and processed logprobs are the same.

    Raises:
        ConfigError: for sampling options the trainer cannot follow (temperature 0, min_p, penalties, logit bias).
    """
    from agentic_rl.train.logprobs import SamplingDistribution

    distribution = SamplingDistribution.of(config.rollout.sampling)
    return None if distribution.is_plain else distribution


def _feed(run: _Run, state: dict[str, Any] | None) -> Any:
    """The run's `ContinuousRollout`: rollout batches of this rank's share of each step's tasks (`_TaskOrder`,
    sharded by group), batch s sampled with step s's options, admitted under `rollout.max_staleness`, with
    `rollout.dynamic_sampling` (one rank only) extra draws from the same order; resuming, the checkpoint's admitted
    but untrained groups are rolled out again first."""
    from agentic_rl.loop.scheduler import ContinuousRollout, PendingGroup
    from agentic_rl.train.distributed import shard

    r = run.config.rollout
    if r.placement == "pause" and not r.max_staleness:
        logger.warning(
            "rollout.placement 'pause' has no effect in lockstep training (rollout.max_staleness: 0): "
            "nothing is generated while the trainer steps"
        )
    saved = (state or {}).get("rollout") or {}
    return ContinuousRollout(
        run=lambda tasks, sampling, indices: run.rollout.run(tasks, sampling, indices=indices),
        next_batch=lambda: shard(run.task_order.next_batch(), run.dist),
        sampling=lambda batch: _sampling(run, batch),
        group_size=r.group_size,
        groups_per_step=r.tasks_per_step,
        max_staleness=r.max_staleness,
        n_parallel_agents=r.n_parallel_agents,
        first_step=run.done,
        last_step=run.config.steps,
        pending=[PendingGroup(**p) for p in saved.get("pending", ())],
        next_batch_index=saved.get("next_batch"),
        whole_batches=run.rollout.whole_batches,
        dynamic_sampling=r.dynamic_sampling,
        max_extra_draws=r.max_extra_draws,
        step_level=run.config.optimizer.advantage == "step",
        overlong_filter=run.config.optimizer.overlong_filter,
    )


async def _run_steps(run: _Run, on_step: Callable[[dict[str, Any]], None] | None) -> None:
    """Steps `run.done` ... `config.steps - 1`, with the rollout's batches admitted in the background meanwhile."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(run.feed.serve)
        mark = time.perf_counter()
        for step in range(run.done, run.config.steps):
            figures = await _train_step(run, step, mark)
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


async def _train_step(run: _Run, step: int, started: float) -> StepFigures:
    """Training step `step` (0-based) on this rank: wait for its groups (`ContinuousRollout.next_step`; in lockstep,
    the whole rollout), one GRPO step on their trajectories in a worker thread, then the new weights into the engine
    (asleep during the GRPO step when `engine.sleep_while_training`; generation paused during it with the `pause`
    placement, running on with `overlap`). Their task ids go to the task ids file, in training order."""
    from agentic_rl.loop.scheduler import drop_stale_groups
    from agentic_rl.loop.sources import refuse_untrainable

    config = run.config
    sleep = config.engine.sleep_while_training
    pause = config.rollout.placement == "pause" and config.rollout.max_staleness > 0  # lockstep has nothing to pause
    t0 = time.perf_counter()
    groups = await run.feed.next_step(step)
    rollout_s = time.perf_counter() - t0
    with run.task_ids.open("a") as f:
        f.write(json.dumps(run.feed.step_record(step, groups, _task_id), default=str) + "\n")
    trajectories = [t for g in groups for t in g.trajectories]
    dropped = drop_stale_groups(groups, run.engine.weight_version, config.rollout.max_staleness)
    refused = refuse_untrainable(trajectories, run.rollout.ledger)
    if all(t.failed for t in trajectories):  # each says why in its `error` (rollouts/step_K.jsonl)
        logger.warning("step %d: every trajectory of this rank failed or was refused: none trains", step + 1)
    if pause:
        await run.engine.pause_generation()
    if sleep:
        await run.engine.sleep()
    ids = [i for i, g in enumerate(groups) for _ in g.trajectories]  # GRPO groups: the step's task positions
    train = functools.partial(
        run.trainer.train_step, trajectories, group_ids=ids, weight_version=run.engine.weight_version
    )
    stats = await anyio.to_thread.run_sync(train)
    t0 = time.perf_counter()
    if sleep:
        await run.engine.wake_up(["weights"])
    await run.sync.push()
    if sleep:
        await run.engine.wake_up(["kv_cache"])
    if pause:
        await run.engine.resume_generation()
    sync_s = time.perf_counter() - t0
    run.rollout.ledger.forget_before(run.engine.weight_version - config.rollout.max_staleness)  # none trainable
    run.feed.step_done()
    failed = sum(g.failed for g in groups) - dropped  # every sample failed or was refused, other than as stale
    counts = {
        "trained": len(groups) - dropped - failed,
        "failed": failed,
        "dropped_stale": dropped,
        "in_flight": len(run.feed.groups),
        **run.feed.step_counts,
    }
    left_out = [t for g in run.feed.constant for t in g.trajectories]
    return StepFigures(
        trajectories,
        refused,
        stats,
        rollout_s,
        sync_s,
        time.perf_counter() - started,
        counts,
        _task_ids(groups),
        left_out,
        _task_ids(run.feed.constant),
    )


async def _record_step(run: _Run, step: int, row: dict[str, Any], figures: StepFigures) -> None:
    """After step `step` (0-based): evaluate when due (every `eval_every` steps and after the last; into `row`), keep
    the row, and (rank 0) log it, write the step's trajectories and, every `checkpoint_every` steps, a checkpoint."""
    config, done = run.config, step + 1
    if run.eval_tasks and (done == config.steps or (config.eval_every and done % config.eval_every == 0)):
        row.update(await _evaluate(run, run.out / "rollouts" / f"eval_step_{done}.jsonl"))
    run.history.append(row)
    if not run.dist.is_main:
        return
    _log(run, row, step=done)
    write_trajectories(run.out / "rollouts" / f"step_{done}.jsonl", figures.trajectories, figures.task_ids)
    left_out = run.out / "rollouts" / f"step_{done}_left_out.jsonl"
    if figures.left_out:  # what dynamic sampling left out: sampled, never trained
        write_trajectories(left_out, figures.left_out, figures.left_out_task_ids)
    else:  # a step redone after a resume may leave out what the first try did not
        left_out.unlink(missing_ok=True)
    if config.checkpoint_every and done % config.checkpoint_every == 0:
        _save_checkpoint(run, f"step_{done}", done)
        checkpoints.prune_checkpoints(run.out / "checkpoints", config.keep_checkpoints)


def _finish(run: _Run) -> None:
    """After the last step: (rank 0) the final checkpoint, unless the run resumed from it, and the plots; then this
    rank's weights digest."""
    from agentic_rl.train.plots import write_run_plots

    if run.dist.is_main:
        if run.start is None or run.start.path.name != checkpoints.FINAL:
            _save_checkpoint(run, checkpoints.FINAL, run.config.steps)
        write_run_plots(run.out)
    (run.out / f"weights_rank{run.dist.rank}.sha256").write_text(weights_digest(run.trainer.module) + "\n")


def _log(run: _Run, row: dict[str, Any], *, step: int) -> None:
    """Hand `row` to every metric sink (rank 0's; the other ranks have none)."""
    for sink in run.sinks:
        sink.log(row, step=step)


async def _evaluate(run: _Run, records: Path) -> dict[str, float]:
    """Greedy (or `eval_temperature`) rollout of the held-out tasks through the same rollout path (this rank's
    shard; ranks gathered), its trajectories written (rank 0's) to `records`.

    Returns:
        `heldout_accuracy` (share with a positive task reward: with the LLM judge, the judge's accuracy),
        `heldout_tool_call_rate`, `heldout_mean_turns`, and `reward_figures` prefixed `heldout_` (e.g.
        `heldout_hotpotqa_f1`, `heldout_judge_failures`).
    """
    from agentic_rl.train.distributed import shard

    trajectories = await run.rollout.run(shard(run.eval_tasks, run.dist), _sampling(run, None))
    local = {
        "solved": float(sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories)),
        "with_tool_calls": float(sum(t.metrics.get("tool_calls", 0) > 0 for t in trajectories)),
        "turns": float(sum(t.metrics.get("steps", 0) for t in trajectories)),
        "trajectories": float(len(trajectories)),
    }
    totals = {key: sum(values) for key, values in gather(run.dist, HELDOUT_COUNTS, local).items()}
    n = max(totals["trajectories"], 1.0)
    if run.dist.is_main:
        write_trajectories(records, trajectories)
    return {
        "heldout_accuracy": totals["solved"] / n,
        "heldout_tool_call_rate": totals["with_tool_calls"] / n,
        "heldout_mean_turns": totals["turns"] / n,
        **reward_figures(run.dist, trajectories, reward_keys(run.config), prefix="heldout_"),
    }


def _finished(out: Path, start: Checkpoint | None, world_size: int) -> bool:
    """Whether a resumed run wrote everything its end writes: the final checkpoint, then (rank 0) the plots, then
    every rank's weights digest. A run killed before that (say after `step_K` of its last step, before `final/`)
    takes the usual path, which runs no step and writes what is missing. Every rank decides alike."""
    return (
        start is not None
        and start.path.name == checkpoints.FINAL
        and all((out / f"weights_rank{rank}.sha256").is_file() for rank in range(world_size))
    )


def _starting_point(config: TrainConfig, dist: Any, *, resume: bool) -> tuple[Checkpoint | None, dict[str, Any] | None]:
    """The checkpoint a `train` call continues from and its saved state; `(None, None)` for a new run or a resumed
    one that has no complete checkpoint yet (it starts over).

    Raises:
        ConfigError: for a new run over an earlier one (`_check_fresh`), or a checkpoint of another world size.
    """
    out = Path(config.output_dir)
    if not resume:
        _check_fresh(out)
        return None, None
    if dist.is_main:
        checkpoints.discard_partial(out / "checkpoints")
    start = resume_point(config)
    if start is None:
        logger.info("resuming %s: no complete checkpoint yet, starting over", out)
        return None, None
    state = checkpoints.load_state(start)
    if state["world_size"] != dist.world_size:
        raise ConfigError(
            f"{start.path} was written by {state['world_size']} rank(s); resume it with as many, not {dist.world_size}"
        )
    logger.info("resuming %s after step %d from %s", out, state["step"], start.path)
    return start, state


def _save_checkpoint(run: _Run, name: str, step: int) -> None:
    """Save `checkpoints/<name>/` after `step` steps: the model (or its LoRA adapter: peft's `save_pretrained` of the
    trainer's module), the tokenizer and the training state (`_state`)."""
    checkpoints.save_checkpoint(run.out / "checkpoints" / name, run.trainer.module, run.tokenizer, _state(run, step))


def _state(run: _Run, step: int) -> dict[str, Any]:
    """The training state saved with a checkpoint after `step` steps, as `training_state.pt`: the optimizer state
    and step counters, the steps done, the task order position, the weight version, the RNG states (Python, NumPy,
    torch; rank 0's, which every rank restores: all ranks seed alike), the metrics rows so far and the world size.
    A checkpoint is written atomically (`agentic_rl.train.checkpoints`): a kill at any moment leaves the previous
    one intact."""
    return {
        "step": step,
        "trainer": run.trainer.state_dict(),
        "task_position": run.task_order.position,
        "weight_version": run.engine.weight_version,
        "rng": checkpoints.capture_rng_state(),
        "history": run.history,
        "world_size": run.dist.world_size,
        "rollout": run.feed.checkpoint(),
    }
