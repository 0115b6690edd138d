"""Rows of a packed batch grouped by length, so that each forward pass pads to its own rows' width.

A packed batch pads every row to the longest prompt plus the longest response. Rows of a tool-use batch differ
a lot in length (one tool call or three, a short or a long answer), so a third or more of a padded forward can be
padding. `length_buckets` splits the rows into groups of similar length, each run as its own forward pass (after
`PackedBatch.select(..., trim=True)`): of the splits of the rows ordered by length into consecutive runs, the one
with the fewest padded token passes plus a fixed cost per pass. (A split outside that order can be cheaper when
rows of one length differ in how it divides between prompt and response; the length order is the usual case.)
"""

from __future__ import annotations

import math

import torch

__all__ = ["BUCKET_OVERHEAD_TOKENS", "length_buckets"]

BUCKET_OVERHEAD_TOKENS = {"cpu": 64}
"""The fixed cost of one more forward/backward pass, in token passes, per device type.

On the CPU a token of SmolLM2-135M costs ~10 ms forward and backward; a pass's fixed cost (op dispatch, smaller
matrix products) is well under a second, so 64 tokens is conservative. Devices not listed use
`DEFAULT_OVERHEAD_TOKENS`: a GPU runs a token's share of a batch in microseconds, so a pass's kernel launches are
worth thousands of tokens there and only a large padding saving splits a batch."""

DEFAULT_OVERHEAD_TOKENS = 4096


def length_buckets(
    attention_mask: torch.Tensor, prompt_width: int, *, skip: int = 0, overhead: float | None = None
) -> list[torch.Tensor]:
    """Row groups that minimize the padded token passes of one forward pass per group.

    Rows are ordered by real length (prompt + response) and cut into contiguous runs by dynamic programming over
    the cost of a group of n rows: `n * (longest prompt + longest response - skip) + overhead`, the width a trimmed
    selection of those rows has (prompts left-padded, responses right-padded; see `PackedBatch.select`).

    Args:
        attention_mask: (B, P + R) int, 1 on real tokens; prompts left-padded to P, responses right-padded.
        prompt_width: P.
        skip: leading tokens every row shares that are computed once for the whole batch (a shared prefix).
        overhead: token passes one more group costs (default: `BUCKET_OVERHEAD_TOKENS` for the mask's device).

    Returns:
        (n_i,) int64 row indices per group, on the mask's device; together they are every row exactly once.
        A single group of all rows when splitting saves nothing.
    """
    n_rows = attention_mask.shape[0]
    if overhead is None:
        overhead = BUCKET_OVERHEAD_TOKENS.get(attention_mask.device.type, DEFAULT_OVERHEAD_TOKENS)
    device = attention_mask.device
    if n_rows < 2:
        return [torch.arange(n_rows, device=device)]
    prompts = attention_mask[:, :prompt_width].sum(1).tolist()
    responses = attention_mask[:, prompt_width:].sum(1).tolist()
    order = sorted(range(n_rows), key=lambda i: (prompts[i] + responses[i], i))
    best = [0.0] + [math.inf] * n_rows  # best[j]: cheapest cost of the first j rows in `order`
    start = [0] * (n_rows + 1)  # where the last group of that cheapest split starts
    for j in range(1, n_rows + 1):
        longest_prompt = longest_response = 0
        for i in range(j - 1, -1, -1):
            longest_prompt = max(longest_prompt, prompts[order[i]])
            longest_response = max(longest_response, responses[order[i]])
            cost = best[i] + (j - i) * (longest_prompt + longest_response - skip) + overhead
            if cost < best[j]:
                best[j], start[j] = cost, i
    groups: list[torch.Tensor] = []
    j = n_rows
    while j > 0:
        groups.append(torch.tensor(order[start[j] : j], dtype=torch.int64, device=device))
        j = start[j]
    groups.reverse()
    return groups
