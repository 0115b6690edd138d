"""A training run: rollout -> GRPO step -> weight sync into the colocated engine -> next rollout.

`run` holds the step loop, `setup` the run's composition root, `config` its configuration, `scheduler` the
bounded-staleness scheduler, `sources` what the run rolls out with, `weight_sync` how weights reach the engine,
`metrics` the per-step row, `rewards` the run's reward assembly and `sft` the cold-start supervised recipe.
"""

import agentic_rl.loop.sft  # noqa: F401  (registers the derived models smollm2-135m-tools and -research)
from agentic_rl.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(
            ("EngineSection", "JudgeSection", "RolloutSection", "TrainConfig", "load_run_config", "load_train_config"),
            "agentic_rl.loop.config",
        ),
        **dict.fromkeys(("resume_point", "run_training", "train", "weights_digest"), "agentic_rl.loop.run"),
        **dict.fromkeys(("SFTConfig", "run_sft"), "agentic_rl.loop.sft"),
        "GRPOConfig": "agentic_rl.train.grpo_config",
    },
)
