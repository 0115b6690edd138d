"""The training loop: rollout -> GRPO step -> weight sync into the colocated engine -> next rollout.

With the CLI, the only module that imports both `rollout` and `train`. Runs on one process or under torchrun
(one engine per rank, tasks sharded by group, gradients averaged across ranks).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from pydantic import Field

from agentic_rl.config import Config
from agentic_rl.data import DataColumns
from agentic_rl.engine.base import TrainableEngine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.train import checkpoints
from agentic_rl.train.checkpoints import Checkpoint
from agentic_rl.train.loggers import LoggerName
from agentic_rl.train.trainer import GRPOConfig

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

# Token accounting of a training step (`TokenCounts`), summed over ranks in each metrics row.
_TOKEN_KEYS = ("tokens_sampled", "tokens_trained", "tokens_excluded", "tokens_excluded_failed",
               "tokens_excluded_aborted", "tokens_excluded_over_length")  # fmt: skip


class RolloutSection(Config):
    """Rollout settings of a training run (`tasks_per_step` tasks per rank, `group_size` samples each)."""

    tasks_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(
        default=4, ge=2, description="samples per task: GRPO's baseline is the group's mean reward, so a group of one "
        "has advantage 0 and trains nothing",
    )  # fmt: skip
    n_parallel_agents: int = Field(default=16, ge=1, le=64)
    max_steps: int = Field(default=2, ge=1, le=10)
    max_prompt_length: int = Field(default=1024, ge=1, le=128 * 1024)
    max_response_length: int = Field(default=512, ge=1, le=8192)
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=1.0, max_tokens=256))
    toolcall_weight: float = Field(
        default=0.1, ge=0, allow_inf_nan=False,
        description="reward per share of well-formed tool calls, added to the answer's reward (0: the answer only)",
    )  # fmt: skip


class EngineSection(Config):
    """Engine settings; fp32 by default so the engine's logprobs match the fp32 trainer's."""

    dtype: str = "float32"
    kv_cache_gib: float = Field(default=0.5, gt=0)
    max_model_len: int | None = Field(default=None, ge=16)
    sleep_while_training: bool = False


class TrainConfig(Config):
    """A training run, usually read from YAML (`agentic-rl train --config FILE`)."""

    model: str = "smollm2-135m-instruct"
    data: str = Field(
        default="../shared/data/gsm8k_train.jsonl",
        description="training tasks: JSON Lines, parquet (verl's layout), a datasets save_to_disk folder, "
        "json:/csv:/parquet:FILES, or a generated family such as 'arithmetic:train:4096' (see agentic_rl.data)",
    )
    data_columns: DataColumns = Field(
        default_factory=DataColumns,
        description="which column holds each task field, for data and eval_data (e.g. {question: problem, "
        "answer: solution} or 'question=problem,answer=solution'); default: GSM8K and verl column names",
    )
    tools: list[str] = Field(default_factory=lambda: ["calculator"])
    reward: str = Field(default="gsm8k", description="a name in REWARDS, or 'package.module:function'")
    output_dir: str = "runs/train"
    steps: int = Field(default=3, ge=1)
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = Field(default=0, ge=0, description="0: only the final checkpoint")
    keep_checkpoints: int = Field(
        default=2, ge=0, description="step checkpoints kept, the newest (0: all); the final one is always kept"
    )
    eval_data: str | None = Field(
        default=None, description="held-out tasks (a data spec as for data, e.g. 'arithmetic:heldout:64'), rolled out greedily"
    )
    eval_limit: int | None = Field(default=None, ge=1, description="evaluate the first N held-out tasks (None: all)")
    eval_every: int = Field(default=0, ge=0, description="evaluate every K steps (0: before the first and after the last)")
    loggers: list[LoggerName] = Field(
        default_factory=lambda: ["jsonl"],
        description="metric sinks: jsonl (metrics.jsonl), tensorboard (tensorboard/), wandb (offline, wandb/)",
    )
    wandb_project: str = "agentic-rl"
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    optimizer: GRPOConfig = Field(default_factory=GRPOConfig)


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """`TrainConfig.from_yaml(path, overrides)`: a training config from YAML with `KEY=VALUE` overrides.

    Raises:
        ConfigError: naming the bad override or field.
    """
    return TrainConfig.from_yaml(path, overrides)


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The config a training run recorded (`RUN_DIR/config.json`), with `output_dir` set to `run_dir` (the folder
    may have moved since): what `train(config, resume=True)` continues.

    Raises:
        FileNotFoundError: if `run_dir` has no `config.json`.
        ConfigError: if it is not a valid `TrainConfig`.
    """
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --resume takes a folder written by 'agentic-rl train'")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a training config")
    return TrainConfig.model_validate({**raw, "output_dir": str(run_dir)})


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
        raise ConfigError(f"{out} already holds a training run ({', '.join(earlier)}): continue it with "
                          f"'agentic-rl train --resume {out}', or choose another output_dir")  # fmt: skip


def weights_digest(model: Any) -> str:
    """sha256 over every parameter's bytes, in name order (equal digests = identical weights)."""
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _task_id(task: Any) -> Any:
    return task.get("id") if isinstance(task, dict) else None


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


def _rollout_seed(config: TrainConfig, rank: int, step: int) -> int:
    """The sampling seed of training step `step` (0-based) on `rank`: fixed by the config, different per step and
    rank (the turn loop offsets it per trajectory and turn), so a resumed run samples what the uninterrupted one
    would have."""
    return config.seed + 1000 * rank + 7_368_787 * step


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
    weights' digest and `task_ids_rank{R}.jsonl` (one line per step: the ids of the tasks it rolled out,
    `{"step", "task_ids"}`).

    A checkpoint holds the model and tokenizer and `training_state.pt`: the optimizer state and step counters, the
    steps done, the task order position, the weight version, the RNG states (Python, NumPy, torch; rank 0's, which
    every rank restores: all ranks seed alike) and the metrics rows so far. It is written atomically
    (`agentic_rl.train.checkpoints`): a kill at any moment leaves the previous checkpoint intact. Each step's
    rollout is sampled with a seed fixed by the config, the rank and the step, so a resumed run repeats the
    uninterrupted one.

    Each metrics row holds the step's token accounting summed over ranks (`tokens_sampled` = `tokens_trained` +
    `tokens_excluded`, and `tokens_excluded_failed` / `_aborted` / `_over_length`), the clip fractions, and
    `step_skipped` / `skipped_steps` (optimizer steps skipped for a non-finite gradient norm).

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
        ConfigError: when starting a new run over an earlier one, resuming a checkpoint of another world size, or
            `data` / `eval_data` gives no tasks (checked before the engine starts).
        TrainingError: when `optimizer.max_consecutive_skips` optimizer steps in a row were skipped.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.models import resolve_model
    from agentic_rl.rollout.rewards import resolve_reward
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper
    from agentic_rl.tools.registry import build_tools
    from agentic_rl.train.distributed import init_from_env, shard
    from agentic_rl.train.loggers import build_loggers, keep_steps_before
    from agentic_rl.train.plots import write_run_plots
    from agentic_rl.train.trainer import GRPOTrainer
    from agentic_rl.types import trajectory_to_dict

    dist = init_from_env(config.device)
    out = Path(config.output_dir)
    start, state = _starting_point(config, dist, resume=resume)
    done = state["step"] if state is not None else 0
    if _finished(out, start, dist.world_size):  # nothing to redo: no engine to start
        logger.info("%s finished all %d steps already (%s)", out, config.steps, start.path)
        return list(state["history"])
    tasks = _load_config_tasks(config, "data")
    eval_tasks = _load_config_tasks(config, "eval_data", limit=config.eval_limit) if config.eval_data else []
    device = config.device
    if device in ("cuda", "npu"):  # one accelerator per local rank
        from ascend.device import Platform

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = Platform(device).device(local_rank)
        Platform(config.device).set_device(local_rank)
    torch.manual_seed(config.seed)
    if dist.is_main:
        (out / "rollouts").mkdir(parents=True, exist_ok=True)
        if not resume:
            (out / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    task_ids = out / f"task_ids_rank{dist.rank}.jsonl"
    keep_steps_before(task_ids, done + 1 if state is not None else 0)  # a resumed run redoes the later steps
    model_dir = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    task_order = _TaskOrder(tasks, config.rollout.tasks_per_step * dist.world_size, config.seed)
    r = config.rollout
    engine_options: dict[str, Any] = {"dtype": config.engine.dtype, "kv_cache_gib": config.engine.kv_cache_gib,
                                      "seed": config.seed + dist.rank,
                                      "enable_sleep_mode": config.engine.sleep_while_training}  # fmt: skip
    if config.engine.max_model_len:
        engine_options["max_model_len"] = config.engine.max_model_len
    if state is not None:  # the engine starts from the checkpoint's weights (fp32), at their version
        engine_options["weight_version"] = state["weight_version"]
        if config.engine.dtype == "auto":  # the dtype the model's own folder asks for, as in the first process
            from transformers import AutoConfig

            wanted = getattr(AutoConfig.from_pretrained(str(model_dir)), "dtype", None)
            engine_options["dtype"] = str(wanted).removeprefix("torch.") if wanted else "auto"
    wrapper = ToolAgentEngineWrapper(
        "trainer", tokenizer, r.sampling, r.max_prompt_length, r.max_response_length, r.n_parallel_agents,
        r.max_steps, model=start.path if start is not None else model_dir, tools=build_tools(config.tools),
        reward_fn=resolve_reward(config.reward), engine_options=engine_options, serve=False,
        toolcall_weight=r.toolcall_weight,
    )  # fmt: skip
    wrapper.initialize()
    engine = wrapper.engine
    if not isinstance(engine, TrainableEngine):
        raise ConfigError(f"training needs an engine that takes new weights, got {type(engine).__name__}")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    trainer = GRPOTrainer(model, pad_token_id=tokenizer.pad_token_id, config=config.optimizer, dist=dist)
    history: list[dict[str, Any]] = []
    if state is not None:  # after the trainer copied the initial model as its KL reference
        _restore(trainer, start.path, state)
        task_order.position = state["task_position"]
        history = list(state["history"])
    elif dist.world_size > 1:  # every engine starts from rank 0's weights, like the trainers (a resumed run's
        await engine.update_weights(trainer.named_weights())  # engines all load the same checkpoint)
    sinks: list[Any] = []
    try:
        if dist.is_main:
            sinks = build_loggers(config.loggers, out, config=config.model_dump(), wandb_project=config.wandb_project,
                                  resume_from=(done + 1 if state is not None else 0) if resume else None)  # fmt: skip
        if state is not None:  # last, so that nothing set up since draws from the restored generators
            checkpoints.restore_rng_state(state["rng"])
        if eval_tasks and state is None:
            before = {"step": 0, **await _evaluate(wrapper, eval_tasks, dist, out / "rollouts" / "eval_step_0.jsonl")}
            if dist.is_main:
                for sink in sinks:
                    sink.log(before, step=0)
        for step in range(done, config.steps):
            mine = shard(task_order.next_batch(), dist)
            with task_ids.open("a") as f:
                f.write(json.dumps({"step": step + 1, "task_ids": [_task_id(t) for t in mine]}, default=str) + "\n")
            expanded = [dict(task) for task in mine for _ in range(r.group_size)]  # a group shares its task id
            t0 = time.perf_counter()
            seed = _rollout_seed(config, dist.rank, step)
            rollout = wrapper.make_rollout(sampling=r.sampling.model_copy(update={"seed": seed}))
            trajectories = (await rollout.run(expanded)).trajectories
            rollout_s = time.perf_counter() - t0
            if config.engine.sleep_while_training:
                await engine.sleep()
            stats = await anyio.to_thread.run_sync(trainer.train_step, trajectories)
            t0 = time.perf_counter()
            if config.engine.sleep_while_training:
                await engine.wake_up(["weights"])
            await engine.update_weights(trainer.named_weights())
            if config.engine.sleep_while_training:
                await engine.wake_up(["kv_cache"])
            sync_s = time.perf_counter() - t0
            generated = sum(t.num_generated_tokens for t in trajectories)
            local = [
                stats["reward_mean"], stats["reward_std"],
                sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories) / max(len(trajectories), 1),
                sum(t.failed for t in trajectories), stats["response_length"], generated / max(rollout_s, 1e-9),
                rollout_s, stats["train_seconds"], sync_s,
                math.nan if stats["logprob_diff"] is None else stats["logprob_diff"],  # NaN: this rank computed no row
                *(stats[key] for key in _TOKEN_KEYS),
            ]  # fmt: skip
            ranks = dist.gather_floats(local)
            mean = [sum(col) / len(col) for col in zip(*ranks, strict=False)]
            tokens = {key: int(sum(rk[10 + k] for rk in ranks)) for k, key in enumerate(_TOKEN_KEYS)}
            gaps = [rk[9] for rk in ranks if not math.isnan(rk[9])]  # the ranks that measured it
            row = {
                "step": step + 1, "reward_mean": mean[0], "reward_std": mean[1], "accuracy": mean[2],
                "failed": int(sum(rk[3] for rk in ranks)), "loss": stats["loss"], "pg_loss": stats["pg_loss"],
                "kl": stats["kl"], "grad_norm": stats["grad_norm"], "clip_fraction": stats["clip_fraction"],
                "dual_clip_fraction": stats["dual_clip_fraction"], "kl_clamp_fraction": stats["kl_clamp_fraction"],
                "response_length": mean[4], "tokens_per_s": sum(rk[5] for rk in ranks), "rollout_seconds": mean[6],
                "train_seconds": mean[7], "sync_seconds": mean[8], "logprob_diff": sum(gaps) / len(gaps) if gaps else None,
                **tokens,
                "step_skipped": stats["step_skipped"], "skipped_steps": stats["skipped_steps"],
                "zero_advantage_rows": stats["zero_advantage_rows"], "weight_version": engine.weight_version,
                "trajectories": len(trajectories) * dist.world_size,
            }  # fmt: skip
            last = step + 1 == config.steps
            if eval_tasks and (last or (config.eval_every and (step + 1) % config.eval_every == 0)):
                row.update(await _evaluate(wrapper, eval_tasks, dist, out / "rollouts" / f"eval_step_{step + 1}.jsonl"))
            history.append(row)
            if dist.is_main:
                for sink in sinks:
                    sink.log(row, step=step + 1)
                with (out / "rollouts" / f"step_{step + 1}.jsonl").open("w") as f:
                    for t in trajectories:
                        f.write(json.dumps(trajectory_to_dict(t), ensure_ascii=False) + "\n")
                if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
                    checkpoints.save_checkpoint(out / "checkpoints" / f"step_{step + 1}", trainer.module, tokenizer,
                                                _state(step + 1, trainer, task_order, engine, history, dist))  # fmt: skip
                    checkpoints.prune_checkpoints(out / "checkpoints", config.keep_checkpoints)
            if on_step is not None:
                on_step(row)
        if dist.is_main:
            if start is None or start.path.name != checkpoints.FINAL:
                checkpoints.save_checkpoint(out / "checkpoints" / checkpoints.FINAL, trainer.module, tokenizer,
                                            _state(config.steps, trainer, task_order, engine, history, dist))  # fmt: skip
            write_run_plots(out)
        (out / f"weights_rank{dist.rank}.sha256").write_text(weights_digest(trainer.module) + "\n")
    finally:
        for sink in sinks:
            sink.close()
        await wrapper.close()
    return history


async def _evaluate(wrapper: Any, tasks: list[dict[str, Any]], dist: Any, records: Path) -> dict[str, float]:
    """Greedy rollout of the held-out tasks through the same rollout path (this rank's shard; ranks gathered).

    Returns:
        `heldout_accuracy` (share with a positive task reward), `heldout_tool_call_rate`, `heldout_mean_turns`.
    """
    from agentic_rl.train.distributed import shard
    from agentic_rl.types import trajectory_to_dict

    rollout = wrapper.make_rollout(sampling=wrapper.sampling.model_copy(update={"temperature": 0.0, "seed": None}))
    trajectories = (await rollout.run(shard(tasks, dist))).trajectories
    local = [
        float(sum(t.metrics.get("res_reward", 0.0) > 0 for t in trajectories)),
        float(sum(t.metrics.get("tool_calls", 0) > 0 for t in trajectories)),
        float(sum(t.metrics.get("steps", 0) for t in trajectories)), float(len(trajectories)),
    ]  # fmt: skip
    totals = [sum(col) for col in zip(*dist.gather_floats(local), strict=False)]
    n = max(totals[3], 1.0)
    if dist.is_main:
        with records.open("w") as f:
            for t in trajectories:
                f.write(json.dumps(trajectory_to_dict(t), ensure_ascii=False) + "\n")
    return {"heldout_accuracy": totals[0] / n, "heldout_tool_call_rate": totals[1] / n, "heldout_mean_turns": totals[2] / n}


def _finished(out: Path, start: Checkpoint | None, world_size: int) -> bool:
    """Whether a resumed run wrote everything its end writes: the final checkpoint, then (rank 0) the plots, then
    every rank's weights digest. A run killed before that (say after `step_K` of its last step, before `final/`)
    takes the usual path, which runs no step and writes what is missing. Every rank decides alike."""
    return (start is not None and start.path.name == checkpoints.FINAL
            and all((out / f"weights_rank{rank}.sha256").is_file() for rank in range(world_size)))  # fmt: skip


def _load_config_tasks(config: TrainConfig, field: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The tasks of `config.<field>` (`data` or `eval_data`), read before any engine starts.

    Raises:
        ConfigError: naming the field and its value, for a spec or file that gives no tasks.
    """
    from agentic_rl.data import load_tasks

    spec = getattr(config, field)
    try:
        tasks = load_tasks(spec, limit=limit, columns=config.data_columns)
    except (ConfigError, OSError, ValueError) as exc:
        raise ConfigError(f"TrainConfig.{field}={spec!r}: {exc}") from exc
    if not tasks:
        raise ConfigError(f"TrainConfig.{field}={spec!r} holds no tasks")
    return tasks


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
        raise ConfigError(f"{start.path} was written by {state['world_size']} rank(s); resume it with as many, "
                          f"not {dist.world_size}")  # fmt: skip
    logger.info("resuming %s after step %d from %s", out, state["step"], start.path)
    return start, state


def _state(step: int, trainer: Any, task_order: _TaskOrder, engine: Any, history: list[dict[str, Any]],
           dist: Any) -> dict[str, Any]:  # fmt: skip
    """The training state saved with a checkpoint after `step` steps (see `train`)."""
    return {"step": step, "trainer": trainer.state_dict(), "task_position": task_order.position,
            "weight_version": engine.weight_version, "rng": checkpoints.capture_rng_state(), "history": history,
            "world_size": dist.world_size}  # fmt: skip


def _restore(trainer: Any, folder: Path, state: dict[str, Any]) -> None:
    """Load a checkpoint's weights and optimizer state into `trainer`."""
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    trainer.module.load_state_dict(saved.state_dict())  # copied onto the module's device
    trainer.load_state_dict(state["trainer"])
