"""Trajectories -> padded tensors for a policy-gradient step.

Layout of one row: `[pad ... pad, prompt ..., response ..., pad ... pad]`: prompts are left-padded to a common
width P and responses right-padded to a common width R, so every response starts at column P and the logits
that predict response token j sit at column P - 1 + j.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn.utils.rnn import pad_sequence

from agentic_rl.errors import TrajectoryError
from agentic_rl.types import INSERTED_VERSION, TerminationReason, TokenRun, Trajectory

__all__ = [
    "ExclusionReason",
    "PackedBatch",
    "TokenCounts",
    "default_group_ids",
    "exclusion_reason",
    "is_overlong",
    "pack_trajectories",
]

ExclusionReason = Literal["failed", "aborted", "refused", "overlong"]
"""Why a trajectory's sampled tokens stay out of the loss: `exclusion_reason`'s three (the trajectory is then left out
of its group's statistics too), or `overlong` (overlong filtering, `is_overlong`: its reward still counts)."""

#: Termination reasons of a trajectory cut by a length limit (`is_overlong`).
OVERLONG_REASONS = frozenset({TerminationReason.TRUNCATED, TerminationReason.CONTEXT_LIMIT})


def exclusion_reason(trajectory: Trajectory) -> ExclusionReason | None:
    """Why none of this trajectory's tokens may enter the loss, or None when they all may.

    `aborted`: the engine aborted one of its turns (a step whose `info["finish_reason"]` is `abort`, or a
    termination reason that `TerminationReason.aborts_a_turn`); the turn's tokens are a cut-off sample and the
    reward judged an answer the policy did not finish, so the whole trajectory is left out, even if it was not
    marked failed. `refused`: a trajectory whose record training refused (`Trajectory.refused` says why: its tokens
    are not exactly what the engine sampled, or are too stale). `failed`: `trajectory.failed` for any other reason (an error
    in the engine, environment or reward).
    """
    steps = getattr(trajectory, "steps", None) or ()
    reason = trajectory.termination_reason
    aborted = reason in TerminationReason.__members__.values() and TerminationReason(reason).aborts_a_turn
    if aborted or any(s.info.get("finish_reason") == "abort" for s in steps):
        return "aborted"
    if trajectory.refused is not None:
        return "refused"
    return "failed" if trajectory.failed else None


def is_overlong(trajectory: Trajectory) -> bool:
    """Whether a length limit cut the trajectory: its termination reason is `truncated` (a turn hit the per-turn
    `max_tokens`) or `context_limit` (no room left in the model window or the response budget). With overlong
    filtering (`pack_trajectories(overlong_filter=True)`) such a trajectory keeps its reward in its group's
    statistics but none of its tokens enters the loss (Yu et al. 2025, "DAPO", section 3.4, "Overlong Reward
    Shaping": overlong filtering masks the loss of truncated samples, whose reward judges an unfinished answer)."""
    return trajectory.termination_reason in OVERLONG_REASONS


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """Where the sampled tokens of a packed batch went: `sampled == trained + excluded`, always.

    Attributes:
        sampled: tokens the engine sampled, over every run of every trajectory.
        trained: sampled tokens that enter the loss (`response_mask` 1 in the packed batch).
        excluded_failed: sampled tokens of failed trajectories.
        excluded_aborted: sampled tokens of trajectories with an aborted engine turn (see `exclusion_reason`).
        excluded_refused: sampled tokens of records refused for training (see `exclusion_reason`).
        excluded_over_length: sampled tokens of valid trajectories cut by `max_prompt_length` (a run whose prompt is
            longer is left out whole) or `max_response_length` (a run keeps its first R response tokens).
        excluded_overlong: sampled tokens of valid trajectories left out by overlong filtering (`is_overlong`; only
            with `pack_trajectories(overlong_filter=True)`).
    """

    sampled: int = 0
    trained: int = 0
    excluded_failed: int = 0
    excluded_aborted: int = 0
    excluded_refused: int = 0
    excluded_over_length: int = 0
    excluded_overlong: int = 0

    @property
    def excluded(self) -> int:
        """Sampled tokens that do not enter the loss, for any reason."""
        return (
            self.excluded_failed
            + self.excluded_aborted
            + self.excluded_refused
            + self.excluded_over_length
            + self.excluded_overlong
        )

    def as_metrics(self) -> dict[str, int]:
        """`tokens_sampled`, `tokens_trained`, `tokens_excluded` and
        `tokens_excluded_{failed,aborted,refused,over_length,overlong}`."""
        return {
            "tokens_sampled": self.sampled,
            "tokens_trained": self.trained,
            "tokens_excluded": self.excluded,
            "tokens_excluded_failed": self.excluded_failed,
            "tokens_excluded_aborted": self.excluded_aborted,
            "tokens_excluded_refused": self.excluded_refused,
            "tokens_excluded_over_length": self.excluded_over_length,
            "tokens_excluded_overlong": self.excluded_overlong,
        }


#: The per-row fields of a `PackedBatch` (indexed by `select`); the others describe whole trajectories.
ROW_FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "old_logprobs",
    "weight_versions",
    "rewards",
    "group_ids",
    "valid",
    "truncated",
    "row_trajectory",
)


@dataclass
class PackedBatch:
    """Tensors of a packed batch: B rows (one per exact token run), P prompt columns, R response columns.

    Each `TokenRun` of a trajectory gives one row (`Trajectory.token_runs`: one for a continuous trajectory, one per
    run when its history was rewritten), all sharing its reward, group and advantage; a failed or aborted trajectory
    gives one empty row. N is the number of trajectories; group statistics are taken over trajectories (`trajectory_*` fields), so
    a trajectory with several runs weighs once in its group.

    Attributes:
        input_ids: (B, P + R) int64, pad where `attention_mask` is 0.
        attention_mask: (B, P + R) int64, 1 on real tokens.
        position_ids: (B, P + R) int64, 0 at each row's first real token (0 on left padding).
        responses: (B, R) int64, the response part of `input_ids`.
        response_mask: (B, R) float32, 1 on sampled tokens that enter the loss (0 on observations, glue, padding,
            and on every token of an excluded trajectory or run).
        old_logprobs: (B, R) float32, the engine's logprobs of sampled tokens (nats), 0 where masked.
        weight_versions: (B, R) int64, the engine weight version that sampled each token that enters the loss
            (`TokenRun.weight_versions`); -1 (`INSERTED_VERSION`) where masked, and on every token of a run that did
            not record its versions.
        rewards: (B,) float32, the reward of each row's trajectory (0 on invalid rows).
        group_ids: (B,) int64, the group of each row's trajectory.
        valid: (B,) bool, False for rows of failed or aborted trajectories.
        truncated: (B,) bool, True where a run was cut or left out by `max_prompt_length` / `max_response_length`.
        prompt_width: P.
        row_trajectory: (B,) int64, index (in the packed sequence) of the trajectory each row comes from.
        trajectory_rewards: (N,) float32, trajectory rewards (0 on invalid trajectories).
        trajectory_group_ids: (N,) int64, rows with the same id answered the same task (GRPO groups).
        trajectory_valid: (N,) bool, False for failed or aborted trajectories: excluded from group statistics.
        trajectory_tokens: (N,) int64, tokens each trajectory sampled, over all its runs.
        tokens: where the sampled tokens went (`TokenCounts`).
        trajectory_turns: (N,) int64, the turn index of each packed trajectory when the packed "trajectories" are the
            steps of a rollout (`train.turn_rows.step_units`, step-level advantages: group statistics are then taken per
            group and turn index); None (default) when each packed trajectory is a whole one.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    weight_versions: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    valid: torch.Tensor
    truncated: torch.Tensor
    prompt_width: int
    row_trajectory: torch.Tensor
    trajectory_rewards: torch.Tensor
    trajectory_group_ids: torch.Tensor
    trajectory_valid: torch.Tensor
    trajectory_tokens: torch.Tensor
    tokens: TokenCounts
    trajectory_turns: torch.Tensor | None = None

    @property
    def response_lengths(self) -> torch.Tensor:
        """(B,) int64 sampled tokens per row: `response_mask.sum(-1)`, not the span of the masked tokens."""
        return self.response_mask.sum(-1).long()

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor on `device`."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return PackedBatch(**moved)

    def select(self, rows: torch.Tensor, *, trim: bool = False) -> PackedBatch:
        """The batch of the given rows ((K,) int64 indices), e.g. one micro-batch.

        Per-row tensors are indexed; trajectory-level fields and token counts are kept whole. With `trim`, the
        columns that are padding in every selected row are dropped (leading prompt columns, trailing response
        columns), so a micro-batch of short rows does not compute over the longest row's width; the logprobs of the
        kept response columns are unchanged (pads are masked and position ids count from each row's first token).
        """
        picked = dataclasses.replace(self, **{k: getattr(self, k)[rows] for k in ROW_FIELDS})
        if not trim or picked.input_ids.shape[0] == 0:
            return picked
        p = picked.prompt_width
        real = picked.attention_mask.bool().any(0)  # (P + R,) columns holding a real token in some row
        prompt_real = torch.nonzero(real[:p]).flatten()
        lead = min(int(prompt_real[0]) if prompt_real.numel() else p, p - 1)  # keep >= 1 prompt column
        response_real = torch.nonzero(real[p:]).flatten()
        r = int(response_real[-1]) + 1 if response_real.numel() else 0
        wide = {k: getattr(picked, k)[:, lead : p + r] for k in ("input_ids", "attention_mask", "position_ids")}
        per_token = ("responses", "response_mask", "old_logprobs", "weight_versions")
        narrow = {k: getattr(picked, k)[:, :r] for k in per_token}
        return dataclasses.replace(picked, **wide, **narrow, prompt_width=p - lead)


@dataclass(slots=True)
class _Row:
    prompt: torch.Tensor
    response: torch.Tensor
    mask: torch.Tensor
    logprobs: torch.Tensor | None
    trajectory: int
    truncated: bool = False
    versions: torch.Tensor | None = None


_EMPTY = torch.zeros(0, dtype=torch.long)


def _run_row(
    run: TokenRun, i: int, counts: dict[str, int], max_prompt_length: int | None, max_response_length: int | None
) -> _Row:
    """The row of one run of valid trajectory `i`, cut to the widths; counts its trained and cut tokens."""
    sampled = run.num_sampled
    if max_prompt_length is not None and len(run.prompt_ids) > max_prompt_length:
        counts["excluded_over_length"] += sampled
        return _Row(_EMPTY, _EMPTY, _EMPTY, None, i, truncated=True)
    n = len(run.response_ids)
    cut = n if max_response_length is None else min(max_response_length, n)
    mask = torch.tensor(run.response_mask[:cut], dtype=torch.long)
    kept = int(mask.sum())
    counts["trained"] += kept
    counts["excluded_over_length"] += sampled - kept
    logprobs = None if run.response_logprobs is None else torch.tensor(run.response_logprobs[:cut], dtype=torch.float32)
    versions = None if run.weight_versions is None else torch.tensor(run.weight_versions[:cut], dtype=torch.long)
    return _Row(
        torch.tensor(run.prompt_ids, dtype=torch.long),
        torch.tensor(run.response_ids[:cut], dtype=torch.long),
        mask,
        logprobs,
        i,
        truncated=cut < n,
        versions=versions,
    )


def pack_trajectories(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    group_ids: Sequence[int] | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    overlong_filter: bool = False,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    """Pack every exact token run of the trajectories into one padded batch, and account for every sampled token.

    Args:
        trajectories: N trajectories. Each gives one row per `TokenRun` (`Trajectory.token_runs`); a failed or
            aborted one (`exclusion_reason`) gives one empty, invalid row and its sampled tokens are counted as
            excluded.
        pad_token_id: id written into padding.
        group_ids: one int per trajectory naming its task group; default: each trajectory's `task["id"]` when it
            has one (grouped by value), else its `idx`.
        max_prompt_length: width P; default the longest prompt. A run whose prompt is longer is left out whole
            (cutting the prompt would change the context its tokens were sampled in).
        max_response_length: width R; default the longest response. Longer responses keep their first R tokens
            (the kept tokens' context is unchanged).
        overlong_filter: leave out of the loss every valid trajectory a length limit cut (`is_overlong`): it gives
            one empty row and its sampled tokens are counted in `excluded_overlong`, but it stays valid, so its
            reward still enters its group's mean and std (DAPO masks only its loss; see `is_overlong`).
        device: where the tensors are built.

    Returns:
        A `PackedBatch` whose `tokens` satisfy `sampled == trained + excluded`, where `sampled` counts the tokens
        with mask 1 over every run of every trajectory.

    Raises:
        TrajectoryError: if `trajectories` is empty or `group_ids` has the wrong length.
    """
    n = len(trajectories)
    if n == 0:
        raise TrajectoryError("cannot pack an empty list of trajectories")
    if group_ids is None:
        group_ids = default_group_ids(trajectories)
    if len(group_ids) != n:
        raise TrajectoryError(f"group_ids has {len(group_ids)} entries for {n} trajectories")
    rows, per_trajectory, valid_list, counts = _rows(
        trajectories, max_prompt_length, max_response_length, overlong_filter=overlong_filter
    )
    p = max_prompt_length if max_prompt_length is not None else max(r.prompt.numel() for r in rows)
    r = max_response_length if max_response_length is not None else max(max(x.response.numel() for x in rows), 1)
    trajectory_valid = torch.tensor(valid_list, dtype=torch.bool)
    trajectory_rewards = torch.tensor([float(t.trajectory_reward) for t in trajectories]) * trajectory_valid
    batch = _assemble(
        rows,
        p,
        r,
        pad_token_id,
        trajectory_rewards,
        torch.tensor(list(group_ids), dtype=torch.long),
        trajectory_valid,
        torch.tensor(per_trajectory, dtype=torch.long),
        counts,
    )
    return batch.to(device)


def _rows(
    trajectories: Sequence[Trajectory],
    max_prompt_length: int | None,
    max_response_length: int | None,
    *,
    overlong_filter: bool,
) -> tuple[list[_Row], list[int], list[bool], TokenCounts]:
    """The rows of `pack_trajectories` (one per trained run of a valid trajectory, one empty row for an excluded
    or overlong-filtered one), each trajectory's sampled tokens and validity, and where the sampled tokens went."""
    counts = dict.fromkeys(
        (
            "sampled",
            "trained",
            "excluded_failed",
            "excluded_aborted",
            "excluded_refused",
            "excluded_over_length",
            "excluded_overlong",
        ),
        0,
    )
    per_trajectory: list[int] = []
    valid: list[bool] = []
    rows: list[_Row] = []
    for i, t in enumerate(trajectories):
        reason = exclusion_reason(t)
        runs = t.token_runs()
        sampled = sum(run.num_sampled for run in runs)
        masked = reason is None and overlong_filter and is_overlong(t)  # in the group statistics, not in the loss
        if reason is not None or masked:
            counts[f"excluded_{reason or 'overlong'}"] += sampled
            rows.append(_Row(_EMPTY, _EMPTY, _EMPTY, None, i))
        else:  # a run that sampled nothing (memory rewrote the history, then no room was left) trains nothing
            trained = [run for run in runs if run.num_sampled] or runs[-1:]
            rows.extend(_run_row(run, i, counts, max_prompt_length, max_response_length) for run in trained)
        counts["sampled"] += sampled
        per_trajectory.append(sampled)
        valid.append(reason is None)
    return rows, per_trajectory, valid, TokenCounts(**counts)


def _assemble(
    rows: list[_Row],
    p: int,
    r: int,
    pad_token_id: int,
    trajectory_rewards: torch.Tensor,
    trajectory_group_ids: torch.Tensor,
    trajectory_valid: torch.Tensor,
    trajectory_tokens: torch.Tensor,
    tokens: TokenCounts,
) -> PackedBatch:
    """The padded tensors of `rows` (P prompt columns, R response columns) with the trajectory-level fields."""
    # One C++ padding call per field (`pad_sequence`) instead of a Python copy per row and field.
    lp = torch.tensor([x.prompt.numel() for x in rows], dtype=torch.long)
    lr = torch.tensor([x.response.numel() for x in rows], dtype=torch.long)
    input_ids = torch.cat(
        (
            _pad([x.prompt for x in rows], p, pad_token_id, "left"),
            _pad([x.response for x in rows], r, pad_token_id, "right"),
        ),
        dim=1,
    )
    response_mask = _pad([x.mask for x in rows], r, 0, "right").float()
    old_logprobs = torch.zeros((len(rows), r), dtype=torch.float32)
    if any(x.logprobs is not None for x in rows):
        logprobs = [x.logprobs if x.logprobs is not None else torch.zeros(x.response.numel()) for x in rows]
        old_logprobs = _pad(logprobs, r, 0.0, "right") * response_mask
    weight_versions = torch.full((len(rows), r), INSERTED_VERSION, dtype=torch.long)
    if any(x.versions is not None for x in rows):
        per_row = [torch.full_like(x.response, INSERTED_VERSION) if x.versions is None else x.versions for x in rows]
        weight_versions = _pad(per_row, r, INSERTED_VERSION, "right")
    # Positions count real tokens from 0; left padding is 0 and right padding repeats the last position.
    offset = torch.arange(p + r) - (p - lp)[:, None]
    length = (lp + lr)[:, None]
    attention_mask = ((offset >= 0) & (offset < length)).long()
    position_ids = torch.clamp(offset, torch.zeros_like(length), (length - 1).clamp(min=0))
    row_trajectory = torch.tensor([x.trajectory for x in rows], dtype=torch.long)
    valid = trajectory_valid[row_trajectory]
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        responses=input_ids[:, p:].clone(),
        response_mask=response_mask * valid[:, None],
        old_logprobs=old_logprobs,
        weight_versions=torch.where(response_mask.bool() & valid[:, None], weight_versions, INSERTED_VERSION),
        rewards=trajectory_rewards[row_trajectory],
        group_ids=trajectory_group_ids[row_trajectory],
        valid=valid,
        truncated=torch.tensor([x.truncated for x in rows], dtype=torch.bool),
        prompt_width=p,
        row_trajectory=row_trajectory,
        trajectory_rewards=trajectory_rewards,
        trajectory_group_ids=trajectory_group_ids,
        trajectory_valid=trajectory_valid,
        trajectory_tokens=trajectory_tokens,
        tokens=tokens,
    )


def _pad(rows: list[torch.Tensor], width: int, value: float, side: str) -> torch.Tensor:
    """(len(rows), width) tensor of 1-D `rows` padded with `value` on `side` (every row has <= width items)."""
    if width == 0:
        return torch.full((len(rows), 0), value, dtype=rows[0].dtype)
    out = pad_sequence(rows, batch_first=True, padding_value=value, padding_side=side)
    missing = width - out.shape[1]
    if missing:
        out = torch.nn.functional.pad(out, (missing, 0) if side == "left" else (0, missing), value=value)
    return out


def default_group_ids(trajectories: Sequence[Trajectory]) -> list[int]:
    """One group id per trajectory: trajectories with the same `task["id"]` share one, numbered 0, 1, ... in order of
    first appearance; a trajectory without a task id is its own group (keyed by its `idx`)."""
    ids: dict[object, int] = {}
    out = []
    for t in trajectories:
        task = getattr(t, "task", None)
        key = task.get("id") if isinstance(task, dict) and "id" in task else ("idx", t.idx)
        out.append(ids.setdefault(key, len(ids)))
    return out
