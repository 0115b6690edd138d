"""Training: packing trajectories into tensors, GRPO advantages and loss, the trainer loop (its names load on first
use: `agentic_rl.train.grpo_config` is read without torch)."""

from agentic_rl.lazy import lazy_exports

__all__ = [
    "LOG_RATIO_MAX",
    "LossOutput",
    "PackedBatch",
    "SamplingDistribution",
    "TokenCounts",
    "batch_advantages",
    "exclusion_reason",
    "group_advantages",
    "grpo_loss",
    "pack_trajectories",
    "response_logprobs",
    "sampling_logprobs",
    "token_logprobs",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(("batch_advantages", "group_advantages"), "agentic_rl.train.advantages"),
        **dict.fromkeys(("SamplingDistribution", "sampling_logprobs"), "agentic_rl.train.logprobs"),
        **dict.fromkeys(
            ("LOG_RATIO_MAX", "LossOutput", "grpo_loss", "response_logprobs", "token_logprobs"), "agentic_rl.train.loss"
        ),
        **dict.fromkeys(
            ("PackedBatch", "TokenCounts", "exclusion_reason", "pack_trajectories"), "agentic_rl.train.packing"
        ),
    },
)
