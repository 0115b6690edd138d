"""What a training run's config says, resolved in one call before any output folder or engine starts: `RunPlan`.

`plan_run` works out the sampling distribution the trainer follows, the optimizer's settings and the engine's
options, reads the tasks and the system prompt, builds the harness's configuration, resolves the reward and metric
names (`check_reward`) and loads every class the config names (`load_classes`), so that a mistake in the config
fails in seconds. `loop.setup.set_up` then builds what needs the engine (the reward's in-process judge, the rollout source,
the trainer, the weight sync, the scheduler) from these typed pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig, config_tasks, system_prompt
from agentic_rl.loop.rewards import RewardPlan, check_reward

if TYPE_CHECKING:
    from agentic_rl.rollout.spec import HarnessConfig
    from agentic_rl.train.sampling_distribution import SamplingDistribution
    from agentic_rl.train.trainer import GRPOConfig

__all__ = ["RunPlan", "lora_engine_options", "plan_run"]


@dataclass(frozen=True, slots=True)
class RunPlan:
    """A training run's config, resolved before any output folder or engine starts (`plan_run`).

    Attributes:
        config: the run (checked).
        tasks: the training tasks (`data`).
        eval_tasks: the held-out tasks (`eval_data`, at most `eval_limit`; empty: no evaluation).
        harness: the turn loop's configuration (`RolloutSection.harness_config`).
        system_prompt: the text of `system_prompt_file` (None: the environment's default).
        reward: the reward and metric functions (`check_reward`; None with an agent of your own).
        distribution: the distribution the rollout samples from, which the trainer's logprobs follow (None: plain
            sampling).
        engine_options: the colocated engine's options (the checkpoint's weight version when resuming; with
            `optimizer.lora`, LoRA on: `lora_engine_options`); a resumed run with `engine.dtype: auto` takes the model's own dtype
            (`loop.setup`).
        optimizer: the trainer's settings (a cosine schedule without `lr_decay_steps` decays over `steps`).
    """

    config: TrainConfig
    tasks: list[dict[str, Any]]
    eval_tasks: list[dict[str, Any]]
    harness: HarnessConfig
    system_prompt: str | None
    reward: RewardPlan | None
    distribution: SamplingDistribution | None
    engine_options: dict[str, Any]
    optimizer: GRPOConfig


def plan_run(config: TrainConfig, rank: int, world_size: int, state: dict[str, Any] | None) -> RunPlan:
    """Everything `config` says that needs no engine, for rank `rank` of `world_size`, resuming from a checkpoint's
    `state` (None: from the start).

    Raises:
        ConfigError: for dynamic sampling on several ranks, tasks the config cannot give, a step of more tasks
            (`rollout.tasks_per_step` on each of `world_size` ranks) than the data holds, a harness value out of
            range, a system prompt file that cannot be read, an unknown reward or metric, an unset judge API key
            variable, a class the config names that cannot be loaded, or sampling options the trainer cannot follow.
    """
    from agentic_rl.loop.sources import load_classes

    if config.rollout.dynamic_sampling and world_size > 1:  # each rank would draw its own extra tasks
        raise ConfigError(f"rollout.dynamic_sampling runs on one rank only, not {world_size}")
    distribution = _distribution(config)
    optimizer = _optimizer(config)
    engine_options = _engine_options(config, rank, distribution, state)
    tasks = config_tasks(config, "data")
    _check_step_fits(config, len(tasks), world_size)
    eval_tasks = config_tasks(config, "eval_data", limit=config.eval_limit) if config.eval_data else []
    harness = config.rollout.harness_config()
    prompt = system_prompt(config)
    reward = check_reward(config)
    load_classes(tools=config.tools, environment=config.environment, agent=config.agent)
    return RunPlan(
        config=config,
        tasks=tasks,
        eval_tasks=eval_tasks,
        harness=harness,
        system_prompt=prompt,
        reward=reward,
        distribution=distribution,
        engine_options=engine_options,
        optimizer=optimizer,
    )


def _check_step_fits(config: TrainConfig, n_tasks: int, world_size: int) -> None:
    """Refuse a step of more tasks than the data holds: it would train two groups of one task.

    Raises:
        ConfigError: naming `rollout.tasks_per_step`, the world size, the data's size and `data`.
    """
    per_step = config.rollout.tasks_per_step * world_size
    if per_step > n_tasks:
        ranks = f" x {world_size} ranks = {per_step}" if world_size > 1 else ""
        raise ConfigError(
            f"rollout.tasks_per_step={config.rollout.tasks_per_step}{ranks} tasks per step is more than the "
            f"{n_tasks} task(s) of TrainConfig.data={config.data!r}: a step would train one task twice"
        )


def _distribution(config: TrainConfig) -> SamplingDistribution | None:
    """The distribution the rollout samples from (temperature, top-k, top-p), which the trainer's logprobs follow
    and the engine reports processed logprobs of; None for plain sampling (temperature 1, no truncation), where
    the raw and processed logprobs are the same.

    Raises:
        ConfigError: for sampling options the trainer cannot follow (temperature 0, min_p, penalties, logit bias).
    """
    from agentic_rl.train.sampling_distribution import SamplingDistribution

    distribution = SamplingDistribution.of(config.rollout.sampling)
    return None if distribution.is_plain else distribution


def _engine_options(
    config: TrainConfig, rank: int, distribution: SamplingDistribution | None, state: dict[str, Any] | None
) -> dict[str, Any]:
    """The colocated engine's options: the config's dtype, KV cache and window, seeded per rank, able to sleep when
    `sleep_while_training`; resuming, it starts at the checkpoint's weight version; with LoRA, LoRA on
    (`lora_engine_options`)."""
    engine = config.engine
    options: dict[str, Any] = {
        "dtype": engine.dtype,
        "kv_cache_gib": engine.kv_cache_gib,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "seed": config.seed + rank - rank % config.engine.tensor_parallel_size,  # a shard has its leader's
        "enable_sleep_mode": engine.sleep_while_training,
    }
    if engine.max_model_len:
        options["max_model_len"] = engine.max_model_len
    if distribution is not None:  # the sampled token's logprob under the distribution it was drawn from
        options["logprobs_mode"] = "processed"
    if state is not None:  # the engine starts from the checkpoint's weights (fp32), at their version
        options["weight_version"] = state["weight_version"]
    return {**options, **lora_engine_options(config, state)}


def lora_engine_options(config: TrainConfig, state: dict[str, Any] | None) -> dict[str, Any]:
    """The engine options LoRA training adds (none without `optimizer.lora`): LoRA on for the adapter's rank, and
    room for the adapters of every weight version a trained token may come from (`rollout.max_staleness + 1`).
    Resuming, the engine starts one version before the checkpoint's: `WeightSync.at_start` loads the checkpoint's
    adapter as that version."""
    lora = config.optimizer.lora
    if lora is None:
        return {}
    options: dict[str, Any] = {"max_lora_rank": _engine_rank(lora.rank), "max_loras": config.rollout.max_staleness + 1}
    if state is not None:
        options["weight_version"] = state["weight_version"] - 1
    return options


def _engine_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM takes (`engine.adapters.MAX_LORA_RANKS`) that serves an adapter of `rank`."""
    from agentic_rl.engine.adapters import MAX_LORA_RANKS

    return next((size for size in MAX_LORA_RANKS if size >= rank), rank)


def _optimizer(config: TrainConfig) -> GRPOConfig:
    """The trainer's settings: `config.optimizer`, a cosine schedule without `lr_decay_steps` spanning the run."""
    optimizer = config.optimizer
    if optimizer.lr_schedule == "cosine" and optimizer.lr_decay_steps is None:
        optimizer = optimizer.model_copy(update={"lr_decay_steps": config.steps})
    return optimizer
