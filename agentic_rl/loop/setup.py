"""The composition root of a training run: everything `loop.run.train` needs before its first step.

`set_up` works from a resolved config (`plan_run`: tasks, system prompt, reward names, classes, engine options, ...,
before any folder or engine starts): it prepares `output_dir`, builds the trainer (LoRA wrapping included) and,
resuming, brings a checkpoint's state back (`starting_point`), all before the colocated engine starts; then it
starts the engine, the rollout source over it, the weight sync and the scheduler that feeds the trainer
(`ContinuousRollout`). Set-up is all or nothing: a failure after the engine started closes what started (the engine
first). The result is one typed `RunState`, which also captures the state a checkpoint saves
(`RunState.training_state`). The step loop itself is `loop.run`.
"""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from agentic_rl.engine.base import PausableEngine, TrainableEngine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.tensor_parallel import EngineGroup
from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.loop.engine_groups import FollowerFeed, GroupHandoff, check_tensor_parallel, rollout_context
from agentic_rl.loop.memory_plan import MemoryPlan, run_memory_plan
from agentic_rl.loop.plan import RunPlan
from agentic_rl.loop.ranges import check_model_window
from agentic_rl.loop.rewards import build_reward
from agentic_rl.loop.task_order import TaskOrder
from agentic_rl.loop.weight_sync import WeightSync, restore_weights
from agentic_rl.rollout.bounded import close_quietly
from agentic_rl.train import checkpoints
from agentic_rl.train.checkpoints import Checkpoint
from agentic_rl.train.sharded_checkpoints import is_sharded_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentic_rl.loop.scheduler import ContinuousRollout, PendingGroup
    from agentic_rl.loop.sources import TrainingRollout
    from agentic_rl.train.distributed import DistContext
    from agentic_rl.train.loggers import MetricsLogger
    from agentic_rl.train.trainer import GRPOTrainer

__all__ = [
    "ROLLOUT_CLOSE_TIMEOUT_S",
    "RunState",
    "close_engine",
    "close_rollout",
    "finished",
    "first_redone",
    "resume_point",
    "set_up",
    "starting_point",
    "step_sampling",
]

logger = logging.getLogger(__name__)

#: The longest a run waits for its rollout to close (user environments, tools and reward workers) before it closes
#: the engine anyway.
ROLLOUT_CLOSE_TIMEOUT_S = 60.0


def resume_point(config: TrainConfig) -> Checkpoint | None:
    """The checkpoint `train(config, resume=True)` continues from: the newest complete one under
    `output_dir/checkpoints` (None: it starts over)."""
    return checkpoints.latest_checkpoint(Path(config.output_dir) / "checkpoints", final_step=config.steps)


def starting_point(
    config: TrainConfig, dist: DistContext, *, resume: bool
) -> tuple[Checkpoint | None, dict[str, Any] | None, bool]:
    """The checkpoint a `train` call continues from, its saved state, and whether the run is `finished` already;
    `(None, None, False)` for a new run or a resumed one that has no complete checkpoint yet (it starts over).

    Rank 0 chooses (after it removes what a kill during a save left) and broadcasts its choice, so that every rank
    resumes the same checkpoint and agrees on `finished`: ranks reading the folder each for themselves could see it
    at different moments, and one that went on would wait forever for the others.

    Raises:
        ConfigError: for a new run over an earlier one (`_check_fresh`), or a checkpoint of another world size.
    """
    out = Path(config.output_dir)
    if not resume:
        _check_fresh(out)
        return None, None, False
    decision = [-1.0, 0.0, 0.0]  # the step (-1: no checkpoint), final or step_K, finished
    if dist.is_main:
        checkpoints.discard_partial(out / "checkpoints")
        chosen = resume_point(config)
        if chosen is not None:
            final = chosen.path.name == checkpoints.FINAL
            decision = [float(chosen.step), float(final), float(finished(out, chosen, dist.world_size))]
    step, final, done = dist.broadcast_floats(decision)
    if step < 0:
        logger.info("resuming %s: no complete checkpoint yet, starting over", out)
        return None, None, False
    name = checkpoints.FINAL if final else f"step_{int(step)}"
    start = Checkpoint(out / "checkpoints" / name, int(step))
    state = checkpoints.load_state(start)
    if state["world_size"] != dist.world_size:
        raise ConfigError(
            f"{start.path} was written by {state['world_size']} rank(s); resume it with as many, not "
            f"{dist.world_size}, or start a new run from its model: 'agentic-rl merge --checkpoint {start.path} "
            f"--out DIR' writes it as a plain model folder; then start a new run with 'model: DIR'"
        )
    logger.info("resuming %s after step %d from %s", out, state["step"], start.path)
    return start, state, bool(done)


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


def finished(out: Path, start: Checkpoint | None, world_size: int) -> bool:
    """Whether a resumed run wrote everything its end writes: the final checkpoint, then (rank 0) the plots, then
    every rank's weights digest. A run killed before that (say after `step_K` of its last step, before `final/`)
    takes the usual path, which runs no step and writes what is missing. Rank 0 answers for every rank
    (`starting_point`)."""
    return (
        start is not None
        and start.path.name == checkpoints.FINAL
        and all((out / f"weights_rank{rank}.sha256").is_file() for rank in range(world_size))
    )


def first_redone(state: dict[str, Any] | None) -> int:
    """The first step (1-based) a run resumed from `state` redoes: rows of it and later ones are dropped from the
    per-step files (0 without a state: all are)."""
    return state["step"] + 1 if state is not None else 0


@dataclass(slots=True)
class RunState:
    """What a training run holds from its set-up (`set_up`) to its end.

    Attributes:
        config: the run (checked).
        dist: this process's rank among `world_size`.
        out: `config.output_dir`.
        start: the checkpoint it resumed from (None: from the start).
        done: steps done before this call (the checkpoint's step; 0 from the start).
        eval_tasks: held-out tasks (empty: no evaluation).
        eval_sampling: this rank's sampling options of the held-out evaluation (`step_sampling`).
        task_order: the training tasks, in the order the steps take them.
        task_ids: this rank's task ids file, `task_ids_rank{R}.jsonl`.
        tokenizer: the model's tokenizer (saved with each checkpoint).
        trainer: the GRPO learner.
        engine: the colocated engine the rollouts sample from.
        sync: how the trainer's weights (or LoRA adapter) reach the engine.
        rollout: the `TrainingRollout` every rollout of the run goes through, closed at the end.
        feed: the `ContinuousRollout` that hands the steps their task groups.
        sinks: rank 0's metric sinks (`build_loggers`), filled when the run starts.
        history: the metrics rows so far.
        memory_plan: the run's per-card memory plan (`loop.memory_plan`; None where the model's config gives none).
    """

    config: TrainConfig
    dist: DistContext
    out: Path
    start: Checkpoint | None
    done: int
    eval_tasks: list[dict[str, Any]]
    eval_sampling: SamplingConfig
    task_order: TaskOrder
    task_ids: Path
    tokenizer: PreTrainedTokenizerBase
    trainer: GRPOTrainer
    engine: TrainableEngine
    sync: WeightSync
    rollout: TrainingRollout | None
    feed: ContinuousRollout | FollowerFeed
    sinks: list[MetricsLogger] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    memory_plan: MemoryPlan | None = None
    group: EngineGroup | None = None
    handoff: GroupHandoff | None = None

    @property
    def rolls_out(self) -> bool:
        """Whether this rank runs the rollout: every rank, or with tensor-parallel engines each group's leader."""
        return self.group is None or self.group.is_leader

    def training_state(self, step: int, rollouts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The training state saved with a checkpoint after `step` steps, as `training_state.pt`: the optimizer state
        and step counters, the steps done, the task order position, the weight version, the RNG states (Python, NumPy,
        torch; rank 0's, which every rank restores: all ranks seed alike), the metrics rows so far and the world size.
        A checkpoint is written atomically (`agentic_rl.train.checkpoints`): a kill at any moment leaves the previous
        one intact."""
        return {
            "step": step,
            "trainer": self.trainer.state_dict(),
            "task_position": self.task_order.position,
            "weight_version": self.engine.weight_version,
            "rng": checkpoints.capture_rng_state(),
            "history": self.history,
            "world_size": self.dist.world_size,
            # every rank's admitted but untrained groups (`ContinuousRollout.checkpoint`, gathered by the caller:
            # `loop.run._save_checkpoint`), each rank's own rolled out again on resuming
            "rollout": {"ranks": rollouts if rollouts is not None else [self.feed.checkpoint()]},
        }


async def set_up(
    plan: RunPlan,
    dist: DistContext,
    start: Checkpoint | None,
    state: dict[str, Any] | None,
    *,
    resume: bool,
    group: EngineGroup | None = None,
) -> RunState:
    """Everything a run needs before its first step, from its `plan` (`loop.plan.plan_run`: what the config says,
    resolved before any folder or engine starts), in this order: `output_dir`, the trainer (with `optimizer.lora`,
    its adapter) and, resuming, the checkpoint's `state` (all but the RNG states, which `train` restores last), the
    task order; then the colocated engine, the rollout machinery over it and the weight sync (`_start_engine_side`).
    Without a resume, on several ranks, every engine loads rank 0's weights, like the trainers (a resumed run's
    engines all load the same checkpoint). The metric sinks are `train`'s to add. With a tensor-parallel engine
    `group` every rank of the group builds its shard of the engine; only the leader builds the rollout
    (`loop.engine_groups`).

    All or nothing: what can fail without the engine fails before it starts, and a failure after it started closes
    the engine, then the rollout and the weight sync, before the error goes on.

    Raises:
        ConfigError: for LoRA target modules the model lacks, a window longer than the model's, an engine that cannot take new weights or pause, a
            class the config names that cannot be built, or a checkpoint whose pending tasks are not the data's.
        EngineError: if the engine fails to start.
    """
    import torch
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    config = plan.config
    device = _local_device(config.device)
    torch.manual_seed(config.seed)
    out = Path(config.output_dir)
    task_ids = _prepare_output(config, dist, first_redone(state), resume=resume)
    model_dir = await anyio.to_thread.run_sync(resolve_model, config.model)  # may build it: off the event loop
    check_model_window(config, model_dir)
    check_tensor_parallel(config, model_dir, dist.world_size)
    memory = _memory_plan(config, model_dir, dist)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    task_order = TaskOrder(plan.tasks, config.rollout.tasks_per_step * dist.world_size, config.seed)
    trainer = _make_trainer(plan, dist, tokenizer, model_dir, device)
    history: list[dict[str, Any]] = []
    if state is not None:  # after the trainer copied the initial model as its KL reference
        restore_weights(trainer, start.path, state)
        task_order.position = state["task_position"]
        history = list(state["history"])
    done = state["step"] if state is not None else 0
    async with AsyncExitStack() as started:
        rollout, engine, sync = await _start_engine_side(
            plan, dist, trainer, tokenizer, model_dir, start, started, group
        )
        handoff = GroupHandoff(group) if group is not None else None
        feed = (
            FollowerFeed(handoff) if rollout is None else _feed(config, dist, rollout, task_order, done, state, group)
        )
        run = RunState(
            config=config,
            dist=dist,
            out=out,
            start=start,
            done=done,
            eval_tasks=plan.eval_tasks,
            task_order=task_order,
            task_ids=task_ids,
            tokenizer=tokenizer,
            trainer=trainer,
            engine=engine,
            sync=sync,
            rollout=rollout,
            feed=feed,
            eval_sampling=step_sampling(config, dist.rank, None),
            history=history,
            memory_plan=memory,
            group=group,
            handoff=handoff,
        )
        started.pop_all()  # set up: from now on `train` closes them
    return run


async def _start_engine_side(
    plan: RunPlan,
    dist: DistContext,
    trainer: GRPOTrainer,
    tokenizer: PreTrainedTokenizerBase,
    model_dir: Path,
    start: Checkpoint | None,
    started: AsyncExitStack,
    group: EngineGroup | None,
) -> tuple[TrainingRollout | None, TrainableEngine, WeightSync]:
    """Start the colocated engine and the rollout over it (`_start_rollouts`), then the weight sync and its first
    push (`WeightSync.at_start`), each pushed onto `started` as it starts: closing it (on a failure) closes the
    engine first, then the rollout (`close_rollout`: bounded, never raising), then removes the sync's folders."""
    rollout, engine = await _start_rollouts(plan, tokenizer, model_dir, start, started, group)
    sync = WeightSync.of(plan.config, trainer, engine)
    started.callback(sync.close)
    started.push_async_callback(close_rollout, rollout)
    started.push_async_callback(close_engine, engine)  # the engine first: closing it twice does nothing
    await sync.at_start(resumed=start is not None, world_size=dist.world_size)
    return rollout, engine, sync


async def close_rollout(rollout: TrainingRollout | None, *, timeout_s: float = ROLLOUT_CLOSE_TIMEOUT_S) -> None:
    """Close `rollout` (its environments, tools and reward workers: user code) without letting it hang or raise:
    shielded from cancellation, given at most `timeout_s` seconds, and what it raises is logged, never raised
    (`rollout.bounded.close_quietly`). None (a follower's) is nothing to close."""
    if rollout is None:
        return
    await close_quietly(rollout.aclose, timeout_s)


async def close_engine(engine: TrainableEngine) -> None:
    """Close `engine` shielded from cancellation; what it raises is logged, never raised."""
    with anyio.CancelScope(shield=True):
        try:
            await engine.close()
        except Exception:
            logger.exception("closing the engine failed")


def _memory_plan(config: TrainConfig, model_dir: Path, dist: DistContext) -> MemoryPlan | None:
    """The run's memory plan (`run_memory_plan`), its summary logged by rank 0; None, logged, where the model's
    config.json gives no plan (a mixture of experts, say): the run goes on without one."""
    try:
        plan = run_memory_plan(config, model_dir, dist.world_size)
    except (ConfigError, OSError, RuntimeError, ValueError) as exc:  # a plan informs; it never stops a run
        logger.info("no memory plan for %s: %s", config.model, exc)
        return None
    if dist.is_main and plan.fits:
        logger.info(plan.summary())
    elif dist.is_main:  # the run goes on (the plan is a worst case: every row at full length), but may be killed
        logger.warning(
            "%s. The run may run out of memory on a step of long rows: a smaller optimizer.micro_batch_size, "
            "optimizer.precision bf16 or optimizer.activation_checkpointing lowers the trainer's part (`agentic-rl "
            "plan --config ...` shows each part)",
            plan.summary(),
        )
    return plan


def _local_device(device: str) -> Any:
    """The trainer's device: one accelerator per local rank (`cuda` / `npu`, made the current one), else `device`."""
    if device not in ("cuda", "npu"):
        return device
    from ascend.device import Platform

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local = Platform(device).device(local_rank)
    Platform(device).set_device(local_rank)
    return local


def _prepare_output(config: TrainConfig, dist: DistContext, first_redone: int, *, resume: bool) -> Path:
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


def _engine_options(plan: RunPlan, model_dir: Path, start: Checkpoint | None) -> dict[str, Any]:
    """The colocated engine's options (`RunPlan.engine_options`); a resumed run with `engine.dtype: auto` starts its
    engine from the checkpoint's fp32 weights, so it asks for the dtype the model's own folder asks for, as in the
    first process. Resumed from a sharded checkpoint (no whole model in it), the engine starts from the model's own
    folder one weight version before the checkpoint's, which `WeightSync.at_start` then pushes (as with LoRA)."""
    options = plan.engine_options
    if start is not None and plan.config.optimizer.lora is None and is_sharded_checkpoint(start.path):
        options = {**options, "weight_version": options["weight_version"] - 1}
    if start is None or plan.config.engine.dtype != "auto":
        return options
    from transformers import AutoConfig

    wanted = getattr(AutoConfig.from_pretrained(str(model_dir)), "dtype", None)
    return {**options, "dtype": str(wanted).removeprefix("torch.") if wanted else "auto"}


async def _start_rollouts(
    plan: RunPlan,
    tokenizer: PreTrainedTokenizerBase,
    model_dir: Path,
    start: Checkpoint | None,
    started: AsyncExitStack,
    group: EngineGroup | None,
) -> tuple[TrainingRollout | None, TrainableEngine]:
    """Start what the run's rollouts share: the chat renderer (its template checked first), a colocated engine
    (`_engine_options`; resuming, the checkpoint's weights when it holds a whole model) and the `TrainingRollout` over
    it (`build_training_rollout`: the built-in tool agent, a user's `environment` or a user's `agent`, whose classes
    `plan_run` loaded before the engine starts). Both go onto `started` (closed in reverse: the engine before the
    rollout); once the run is set up, `loop.run.train` closes them.

    Returns:
        The rollout and its engine; on a follower of a tensor-parallel engine `group`, no rollout (None).

    Raises:
        ConfigError: if the engine cannot take new weights, or a class the config names cannot be loaded or built.
    """
    from agentic_rl.chat import ChatRenderer
    from agentic_rl.loop.sources import build_training_rollout
    from agentic_rl.rollout.agent import start_engine

    config = plan.config
    r = config.rollout
    renderer = ChatRenderer(tokenizer, history_rewrites=r.template_rewrites == "new_run")
    from_checkpoint = start is not None and config.optimizer.lora is None and not is_sharded_checkpoint(start.path)
    weights = start.path if from_checkpoint else model_dir  # LoRA or shards: the base, the weights pushed at start
    options = _engine_options(plan, model_dir, start)
    engine = start_engine(
        weights,
        options,
        max_prompt_length=r.max_prompt_length,
        max_response_length=r.max_response_length,
        group=group,
    )
    started.push_async_callback(close_engine, engine)  # first pushed, last run: see `_start_engine_side`
    if not isinstance(engine, TrainableEngine):
        raise ConfigError(f"training needs an engine that takes new weights, got {type(engine).__name__}")
    if r.max_staleness and r.placement == "pause" and not isinstance(engine, PausableEngine):
        raise ConfigError(
            f"rollout.placement 'pause' needs an engine that can pause generation, got "
            f"{type(engine).__name__}: use placement 'overlap'"
        )
    if group is not None and not group.is_leader:  # it serves its shard of the leader's engine, no more
        return None, engine
    reward_fn = build_reward(plan.reward, engine, renderer)  # the in-process judge asks this engine
    rollout = build_training_rollout(
        engine,
        renderer,
        tokenizer,
        harness=plan.harness,
        n_parallel_agents=r.n_parallel_agents,
        tools=config.tools,
        reward_fn=reward_fn,
        environment=config.environment,
        agent=config.agent,
        system_prompt=plan.system_prompt,
    )
    return rollout, engine


def _make_trainer(
    plan: RunPlan, dist: DistContext, tokenizer: PreTrainedTokenizerBase, model_dir: Path, device: Any
) -> GRPOTrainer:
    """A `GRPOTrainer` of the fp32 model on `device` (the trainer copies it as its KL reference), with the plan's
    optimizer settings, its logprobs under the distribution the rollout samples from. With `optimizer.sharding:
    fsdp` each rank holds the whole model (and reference) on its device until the trainer shards them; the freed
    memory is then handed back to the device before the engine, which sizes its KV cache by what is free, starts."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.train.trainer import GRPOTrainer
    from ascend.device import Platform

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    trainer = GRPOTrainer(
        model, pad_token_id=tokenizer.pad_token_id, config=plan.optimizer, dist=dist, sampling=plan.distribution
    )
    kind = str(device).split(":")[0]
    if kind in ("cuda", "npu"):
        Platform(kind).empty_cache()
    return trainer


def _feed(
    config: TrainConfig,
    dist: DistContext,
    rollout: TrainingRollout,
    task_order: TaskOrder,
    done: int,
    state: dict[str, Any] | None,
    group: EngineGroup | None,
) -> ContinuousRollout:
    """The run's `ContinuousRollout`: rollout batches of this rank's share of each step's tasks (`TaskOrder`,
    sharded by group), batch s sampled with step s's options, admitted under `rollout.max_staleness`, with
    `rollout.dynamic_sampling` (one rank only) extra draws from the same order; resuming, the checkpoint's admitted
    but untrained groups are rolled out again first, their tasks re-read from the task order. With tensor-parallel
    engines, the leader's share is its group's: T times `tasks_per_step` a step (`loop.engine_groups`)."""
    from agentic_rl.loop.scheduler import ContinuousRollout
    from agentic_rl.train.distributed import shard

    r = config.rollout
    if r.placement == "pause" and not r.max_staleness:
        logger.warning(
            "rollout.placement 'pause' has no effect in lockstep training (rollout.max_staleness: 0): "
            "nothing is generated while the trainer steps"
        )
    saved = _rank_rollout((state or {}).get("rollout") or {}, dist.rank)
    sharing = rollout_context(dist, group)
    return ContinuousRollout(
        run=lambda tasks, sampling, indices: rollout.run(tasks, sampling, indices=indices),
        next_batch=lambda: [(p, task_order.task_at(p)) for p in shard(task_order.next_positions(), sharing)],
        sampling=lambda batch: step_sampling(config, dist.rank, batch),
        group_size=r.group_size,
        groups_per_step=r.tasks_per_step * (group.size if group is not None else 1),
        max_staleness=r.max_staleness,
        n_parallel_agents=r.n_parallel_agents,
        first_step=done,
        last_step=config.steps,
        pending=[_pending_group(p) for p in saved.get("pending", ())],
        task_at=task_order.task_at,
        next_batch_index=saved.get("next_batch"),
        whole_batches=rollout.whole_batches,
        dynamic_sampling=r.dynamic_sampling,
        max_extra_draws=r.max_extra_draws,
        step_level=config.optimizer.advantage == "step",
        overlong_filter=config.optimizer.overlong_filter,
    )


def _rank_rollout(saved: dict[str, Any], rank: int) -> dict[str, Any]:
    """This rank's part of a checkpoint's rollout state: its own (`ranks`, one per rank), or from a checkpoint of an
    earlier version (one rank's, rank 0's), that one."""
    if "ranks" not in saved:
        return saved
    ranks = saved["ranks"]
    return ranks[rank] if rank < len(ranks) else {}


def _pending_group(saved: dict[str, Any]) -> PendingGroup:
    """A checkpoint's pending group (`ContinuousRollout.checkpoint`).

    Raises:
        ConfigError: for one of a checkpoint that kept tasks instead of their task order positions.
    """
    from agentic_rl.loop.scheduler import PendingGroup

    if "order" not in saved:
        raise ConfigError(
            "the checkpoint keeps its pending groups' tasks instead of their task order positions (an earlier "
            "version wrote it): resume it with that version, or start the run anew"
        )
    return PendingGroup(saved["batch"], saved["position"], saved["order"], saved.get("task_id"))


def step_sampling(config: TrainConfig, rank: int, step: int | None) -> SamplingConfig:
    """The sampling options of training step `step`'s rollout (0-based: the config's, with the seed
    `derive_seed(config.seed, rank, step)`, which the turn loop offsets per trajectory and turn, so a resumed run
    samples what the uninterrupted one would have), or with `step=None` the held-out evaluation's (greedy and
    unseeded; or at `config.eval_temperature` with a seed of its own (`step=-1`: no training step's), the same at
    every evaluation, which the turn loop offsets per trajectory: each of `eval_samples` samples of a task draws its
    own)."""
    from agentic_rl.engine.sampling import derive_seed

    if step is None:
        temperature = config.eval_temperature
        seed = derive_seed(config.seed, rank=rank, step=-1) if temperature else None  # no step's seed
        update: dict[str, Any] = {"temperature": temperature, "seed": seed}
    else:
        update = {"seed": derive_seed(config.seed, rank=rank, step=step)}
    return config.rollout.sampling.model_copy(update=update)
