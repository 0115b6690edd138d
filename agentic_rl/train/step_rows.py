"""Which rows of a packed batch one GRPO step trains (`StepRows`), how its loss is normalized across micro-batches
and ranks, and how the rows fall into micro-batches (`micro_batches`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentic_rl.train.distributed import DistContext
from agentic_rl.train.packing import PackedBatch

__all__ = ["StepRows", "micro_batches"]


def micro_batches(
    rows: torch.Tensor, owner: torch.Tensor, size: int, *, whole_trajectories: bool
) -> list[torch.Tensor]:
    """Split row indices into chunks of at most `size` rows; with `whole_trajectories`, a trajectory's rows
    (same `owner`) are never split (a chunk may then exceed `size`)."""
    if not rows.numel():
        return []
    if not whole_trajectories:
        return list(torch.split(rows, size))
    chunks: list[list[int]] = [[]]
    owners = owner[rows].tolist()
    for start, row in enumerate(rows.tolist()):
        if start and owners[start] == owners[start - 1]:
            chunks[-1].append(row)
            continue
        span = owners.count(owners[start])
        if chunks[-1] and len(chunks[-1]) + span > size:
            chunks.append([])
        chunks[-1].append(row)
    return [torch.tensor(c, dtype=torch.long, device=rows.device) for c in chunks]


@dataclass(frozen=True, slots=True)
class StepRows:
    """Which rows of a packed batch one step trains, and the counts that normalize its loss.

    Attributes:
        rows: (N,) int64, valid rows with at least one response token; all of them count in the normalizers.
        computed: (M,) int64, the rows of `rows` whose forward runs (all of them with a KL term, else those whose
            advantage is not 0).
        total_tokens: response tokens of `rows` (this rank's).
        total_sequences: trajectories `rows` belong to (this rank's).
        computed_tokens: response tokens of `computed`.
        global_tokens, global_sequences: `total_tokens` and `total_sequences` summed over every rank.
        world_size: ranks whose gradients are averaged (1 without a `DistContext`).
    """

    rows: torch.Tensor
    computed: torch.Tensor
    total_tokens: float
    total_sequences: int
    computed_tokens: float
    global_tokens: float
    global_sequences: float
    world_size: int

    @classmethod
    def of(cls, batch: PackedBatch, advantages: torch.Tensor, *, with_kl: bool, dist: DistContext | None) -> StepRows:
        """The rows of `batch` to train, given each row's (B,) float32 advantage and whether the loss has a KL term;
        every rank of `dist` must call it (the global counts are one all-reduce)."""
        rows = torch.nonzero(batch.valid & (batch.response_mask.sum(-1) > 0)).flatten()
        # Without a KL term a row whose advantage is 0 adds exactly 0 to the loss and its gradient: skip its forward.
        # The normalizers still count it, so the step is the same as with the row.
        computed = rows if with_kl else rows[advantages[rows] != 0]
        tokens = float(batch.response_mask[rows].sum())
        sequences = int(torch.unique(batch.row_trajectory[rows]).numel())
        dist = dist or DistContext()
        global_tokens, global_sequences = dist.allreduce_sum([tokens, float(sequences)])
        return cls(
            rows=rows,
            computed=computed,
            total_tokens=tokens,
            total_sequences=sequences,
            computed_tokens=float(batch.response_mask[computed].sum()),
            global_tokens=global_tokens,
            global_sequences=global_sequences,
            world_size=dist.world_size,
        )

    def loss_normalizer(self, loss_agg_mode: str) -> float:
        """`grpo_loss`'s `normalizer` for every micro-batch of this rank: N / W, with N the response tokens
        (`token-mean`) or sequences (`sequence-mean`) of all ranks and W the world size.

        A micro-batch's loss is then (W / N) times its sum over its tokens (or sequences' token means); the
        micro-batches add up to the rank's share and the ranks' average to the step's loss (`DistContext`).
        """
        count = self.global_tokens if loss_agg_mode == "token-mean" else self.global_sequences
        return max(count, 1.0) / self.world_size

    def report_weights(self, loss_agg_mode: str, micro: PackedBatch) -> tuple[float, float]:
        """What turns a micro-batch's `LossOutput` into its part of this rank's reported means: the factor of its
        loss (normalized by `loss_normalizer`) and its share of the rank's response tokens (for the clip shares)."""
        token_share = float(micro.response_mask.sum()) / self.total_tokens
        count = self.total_tokens if loss_agg_mode == "token-mean" else self.total_sequences
        return self.loss_normalizer(loss_agg_mode) / count, token_share
