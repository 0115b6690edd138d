"""The configuration of a training run (`TrainConfig`), read from YAML or from the folder a run recorded it in.

`agentic_rl.loop` runs it (and exports these names too).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field

from agentic_rl.config import Config
from agentic_rl.data import DataColumns
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.limits import MaxPromptLength, MaxResponseLength, MaxSteps, NParallelAgents
from agentic_rl.train.loggers import LoggerName
from agentic_rl.train.trainer import GRPOConfig

__all__ = ["EngineSection", "RolloutSection", "TrainConfig", "load_run_config", "load_train_config"]


class RolloutSection(Config):
    """Rollout settings of a training run (`tasks_per_step` tasks per rank, `group_size` samples each)."""

    tasks_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(
        default=4, ge=2, description="samples per task: GRPO's baseline is the group's mean reward, so a group of one "
        "has advantage 0 and trains nothing",
    )  # fmt: skip
    n_parallel_agents: NParallelAgents = 16
    max_steps: MaxSteps = 2
    max_prompt_length: MaxPromptLength = 1024
    max_response_length: MaxResponseLength = 512
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
