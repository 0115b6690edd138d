"""Training: packing trajectories into tensors, GRPO advantages and loss, the trainer loop."""

from agentic_rl.train.advantages import batch_advantages, group_advantages
from agentic_rl.train.logprobs import SamplingDistribution, sampling_logprobs
from agentic_rl.train.loss import LOG_RATIO_MAX, LossOutput, grpo_loss, response_logprobs, token_logprobs
from agentic_rl.train.packing import PackedBatch, TokenCounts, exclusion_reason, pack_trajectories

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
