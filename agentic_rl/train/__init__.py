"""Training: packing trajectories into tensors, GRPO advantages and loss, the trainer loop."""

from agentic_rl.train.advantages import group_advantages
from agentic_rl.train.loss import LossOutput, grpo_loss, response_logprobs, token_logprobs
from agentic_rl.train.packing import PackedBatch, pack_trajectories

__all__ = [
    "LossOutput",
    "PackedBatch",
    "group_advantages",
    "grpo_loss",
    "pack_trajectories",
    "response_logprobs",
    "token_logprobs",
]
