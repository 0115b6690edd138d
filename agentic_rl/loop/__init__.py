"""A training run: rollout -> GRPO step -> weight sync into the colocated engine -> next rollout.

`run` holds the step loop, `setup` the run's composition root, `config` its configuration, `scheduler` the
bounded-staleness scheduler, `sources` what the run rolls out with, `weight_sync` how weights reach the engine,
`metrics` the per-step row, `rewards` the run's reward assembly and `sft` the cold-start supervised recipe.
"""

from agentic_rl.loop.config import (
    EngineSection,
    JudgeSection,
    RolloutSection,
    TrainConfig,
    load_run_config,
    load_train_config,
)
from agentic_rl.loop.run import resume_point, run_training, train, weights_digest
from agentic_rl.loop.sft import SFTConfig, run_sft
from agentic_rl.train.trainer import GRPOConfig

__all__ = [
    "EngineSection",
    "GRPOConfig",
    "JudgeSection",
    "RolloutSection",
    "SFTConfig",
    "TrainConfig",
    "load_run_config",
    "load_train_config",
    "resume_point",
    "run_sft",
    "run_training",
    "train",
    "weights_digest",
]
