"""Trajectories -> padded tensors for a policy-gradient step.

Layout of one row: `[pad ... pad, prompt ..., response ..., pad ... pad]`: prompts are left-padded to a common
width P and responses right-padded to a common width R, so every response starts at column P and the logits
that predict response token j sit at column P - 1 + j.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from agentic_rl.errors import TrajectoryError
from agentic_rl.types import Trajectory

__all__ = ["PackedBatch", "pack_trajectories"]


@dataclass
class PackedBatch:
    """Tensors of a packed batch (B rows, P prompt columns, R response columns).

    Attributes:
        input_ids: (B, P + R) int64, pad where `attention_mask` is 0.
        attention_mask: (B, P + R) int64, 1 on real tokens.
        position_ids: (B, P + R) int64, 0 at each row's first real token (0 on left padding).
        responses: (B, R) int64, the response part of `input_ids`.
        response_mask: (B, R) float32, 1 on tokens the engine sampled (0 on observations, glue and padding).
        old_logprobs: (B, R) float32, the engine's logprobs of sampled tokens (nats), 0 where masked.
        rewards: (B,) float32, trajectory rewards (0 on invalid rows).
        group_ids: (B,) int64, rows with the same id answered the same task (GRPO groups).
        valid: (B,) bool, False for failed trajectories: excluded from group statistics and the loss.
        truncated: (B,) bool, True where the prompt or response was cut to fit P or R.
        prompt_width: P.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    valid: torch.Tensor
    truncated: torch.Tensor
    prompt_width: int

    @property
    def response_lengths(self) -> torch.Tensor:
        """(B,) int64 sampled tokens per row: `response_mask.sum(-1)`, not the span of the masked tokens."""
        return self.response_mask.sum(-1).long()

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor on `device`."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return PackedBatch(**moved)

    def select(self, rows: torch.Tensor) -> PackedBatch:
        """The batch of the given rows ((K,) int64 indices), same column widths (e.g. one micro-batch)."""
        picked = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return PackedBatch(**picked)


def pack_trajectories(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    group_ids: Sequence[int] | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    """Pack trajectories into one padded batch.

    Args:
        trajectories: B trajectories; failed ones are packed with `valid=False` (and their tokens, if any).
        pad_token_id: id written into padding.
        group_ids: one int per trajectory naming its task group; default: each trajectory's `task["id"]` when it
            has one (grouped by value), else its `idx`.
        max_prompt_length: width P; default the longest prompt. Longer prompts keep their last P tokens.
        max_response_length: width R; default the longest response. Longer responses keep their first R tokens.
        device: where the tensors are built.

    Returns:
        A `PackedBatch`; rows cut by P or R have `truncated=True`.

    Raises:
        TrajectoryError: if `trajectories` is empty or `group_ids` has the wrong length.
    """
    n = len(trajectories)
    if n == 0:
        raise TrajectoryError("cannot pack an empty list of trajectories")
    if group_ids is None:
        group_ids = _default_groups(trajectories)
    if len(group_ids) != n:
        raise TrajectoryError(f"group_ids has {len(group_ids)} entries for {n} trajectories")
    p = max_prompt_length or max(t.prompt_tokens.numel() for t in trajectories)
    r = max_response_length or max(max(t.response_tokens.numel() for t in trajectories), 1)

    # One C++ padding call per field (`pad_sequence`) instead of a Python copy per row and field.
    prompts = [t.prompt_tokens[-p:] if p else t.prompt_tokens[:0] for t in trajectories]
    responses = [t.response_tokens[:r] for t in trajectories]
    lp = torch.tensor([x.numel() for x in prompts], dtype=torch.long)
    lr = torch.tensor([x.numel() for x in responses], dtype=torch.long)
    truncated = (lp < torch.tensor([t.prompt_tokens.numel() for t in trajectories])) | (
        lr < torch.tensor([t.response_tokens.numel() for t in trajectories])
    )
    input_ids = torch.cat((_pad(prompts, p, pad_token_id, "left"), _pad(responses, r, pad_token_id, "right")), dim=1)
    response_mask = _pad([t.response_masks[: len(x)] for t, x in zip(trajectories, responses, strict=False)], r, 0, "right").float()
    old_logprobs = torch.zeros((n, r), dtype=torch.float32)
    if any(t.response_logprobs is not None for t in trajectories):
        logprobs = [t.response_logprobs[: len(x)] if t.response_logprobs is not None else torch.zeros(len(x))
                    for t, x in zip(trajectories, responses, strict=False)]  # fmt: skip
        old_logprobs = _pad(logprobs, r, 0.0, "right") * response_mask
    # Positions count real tokens from 0; left padding is 0 and right padding repeats the last position.
    offset = torch.arange(p + r) - (p - lp)[:, None]
    length = (lp + lr)[:, None]
    attention_mask = ((offset >= 0) & (offset < length)).long()
    position_ids = torch.clamp(offset, torch.zeros_like(length), (length - 1).clamp(min=0))
    valid = torch.tensor([not t.failed for t in trajectories], dtype=torch.bool)
    rewards = torch.tensor([float(t.trajectory_reward) for t in trajectories], dtype=torch.float32) * valid
    batch = PackedBatch(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        responses=input_ids[:, p:].clone(), response_mask=response_mask * valid[:, None], old_logprobs=old_logprobs,
        rewards=rewards, group_ids=torch.tensor(list(group_ids), dtype=torch.long), valid=valid, truncated=truncated,
        prompt_width=p,
    )  # fmt: skip
    return batch.to(device)


def _pad(rows: list[torch.Tensor], width: int, value: float, side: str) -> torch.Tensor:
    """(len(rows), width) tensor of 1-D `rows` padded with `value` on `side` (every row has <= width items)."""
    if width == 0:
        return torch.full((len(rows), 0), value, dtype=rows[0].dtype)
    out = pad_sequence(rows, batch_first=True, padding_value=value, padding_side=side)
    missing = width - out.shape[1]
    if missing:
        out = torch.nn.functional.pad(out, (missing, 0) if side == "left" else (0, missing), value=value)
    return out


def _default_groups(trajectories: Sequence[Trajectory]) -> list[int]:
    ids: dict[object, int] = {}
    out = []
    for t in trajectories:
        task = getattr(t, "task", None)
        key = task.get("id") if isinstance(task, dict) and "id" in task else ("idx", t.idx)
        out.append(ids.setdefault(key, len(ids)))
    return out
