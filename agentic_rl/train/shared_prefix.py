"""One forward pass for the token prefix every row of a batch shares (e.g. the system prompt and tool schema).

Rows of an SFT or GRPO micro-batch usually open with the same tokens: the system prompt with its tool schema, and
in a GRPO group the question too. `shared_prefix_length` finds how many; `suffix_inputs` lays the rest of each row
out for a forward pass that reads the prefix from a key/value cache computed once (batch 1) and repeated to the
batch. The cache keeps its autograd graph, so gradients through the prefix are the sum over rows, as in the full
forward: the same values and gradients (up to float summation order) for fewer token-layer passes.
"""

from __future__ import annotations

import torch

__all__ = ["MIN_SHARED_PREFIX", "shared_prefix_length", "suffix_inputs"]

MIN_SHARED_PREFIX = 32
"""Shortest shared prefix (tokens) worth a separate forward pass."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> int:
    """Tokens every row's prompt opens with, less one (the last prompt token stays in each row's own part).

    Args:
        input_ids: (B, P + R) int64, prompts left-padded to `prompt_width` P.
        attention_mask: (B, P + R), 1 on real tokens.
        prompt_width: P.

    Returns:
        k >= 0: rows' first k real tokens are equal, and every prompt is longer than k.
    """
    prompt_lengths = attention_mask[:, :prompt_width].sum(1)
    shortest = int(prompt_lengths.min()) if prompt_lengths.numel() else 0
    if input_ids.shape[0] < 2 or shortest < 2:
        return 0
    starts = prompt_width - prompt_lengths  # each row's first real column
    columns = starts.unsqueeze(1) + torch.arange(shortest - 1, device=input_ids.device)  # (B, shortest - 1)
    heads = input_ids.gather(1, columns)
    differs = (heads != heads[:1]).any(0)
    return int(torch.nonzero(differs)[0]) if bool(differs.any()) else shortest - 1


def suffix_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, prompt_width: int, k: int
) -> dict[str, torch.Tensor]:
    """Each row without its first k real tokens, still left-padded to P - k prompt columns.

    Column c of the result holds column c + k of the input (for real tokens of the row's own part the shift is
    exact, because the prefix sits at the front of each left-padded prompt); its mask is the input's mask at c
    for prompt columns and at c + k for response columns, and the returned attention mask prepends k ones for
    the cached prefix.

    Returns:
        `input_ids` (B, P + R - k), `attention_mask` (B, P + R), `position_ids` (B, P + R - k) for a forward
        pass that reads the prefix from a cache of length k.
    """
    p = prompt_width
    mask = torch.cat([attention_mask[:, : p - k], attention_mask[:, p:]], dim=1)
    ones = torch.ones(mask.shape[0], k, dtype=mask.dtype, device=mask.device)
    return {
        "input_ids": input_ids[:, k:],
        "attention_mask": torch.cat([ones, mask], dim=1),
        "position_ids": position_ids[:, k:],
    }
