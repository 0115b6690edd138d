"""Packing trajectories into padded tensors."""

from __future__ import annotations

import pytest
import torch

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.packing import TokenCounts, pack_trajectories
from agentic_rl.types import StepTrajectory, Trajectory

PAD = 0


def _traj(prompt, response, mask, logprobs=None, *, reward=1.0, failed=False, task_id=None, idx=0):
    return StepTrajectory(prompt_tokens=prompt, response_tokens=response, response_masks=mask,
                          response_logprobs=logprobs, trajectory_reward=reward, failed=failed, idx=idx,
                          task=None if task_id is None else {"id": task_id})  # fmt: skip


def test_prompts_are_left_padded_and_responses_right_padded():
    a = _traj([5, 6, 7], [8, 9], [1, 1], [-0.5, -0.25], task_id="q1")
    b = _traj([3], [4, 11, 12, 13], [1, 0, 0, 1], [-1.0, 0.0, 0.0, -2.0], reward=0.0, task_id="q1", idx=1)
    batch = pack_trajectories([a, b], pad_token_id=PAD)

    assert batch.prompt_width == 3
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 0, 0], [0, 0, 3, 4, 11, 12, 13]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]
    assert batch.responses.tolist() == [[8, 9, 0, 0], [4, 11, 12, 13]]
    assert batch.response_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 1]]
    assert batch.old_logprobs.tolist() == [[-0.5, -0.25, 0, 0], [-1.0, 0, 0, -2.0]]
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.group_ids.tolist() == [0, 0]
    assert batch.response_lengths.tolist() == [2, 2]  # mask sum, not the span (row 2 spans 4 columns)
    assert batch.valid.tolist() == [True, True] and batch.truncated.tolist() == [False, False]
    assert batch.input_ids.dtype == torch.long and batch.response_mask.dtype == torch.float32


def test_fixed_widths_never_cut_a_prompt_and_count_what_they_leave_out():
    a = _traj([1, 2, 3, 4], [5, 6, 7], [1, 1, 1], [-1.0, -1.0, -1.0], task_id="q")
    b = _traj([8, 9], [10, 11, 12], [1, 0, 1], [-0.5, 0.0, -0.5], task_id="q", idx=1)
    batch = pack_trajectories([a, b], pad_token_id=PAD, max_prompt_length=2, max_response_length=2)
    # a's prompt does not fit: left out whole (a cut prompt is a context the engine never saw); b keeps [10, 11]
    assert batch.input_ids.tolist() == [[0, 0, 0, 0], [8, 9, 10, 11]]
    assert batch.response_mask.tolist() == [[0, 0], [1, 0]]
    assert batch.old_logprobs.tolist() == [[0, 0], [-0.5, 0]]
    assert batch.truncated.tolist() == [True, True] and batch.valid.tolist() == [True, True]
    assert batch.tokens == TokenCounts(sampled=5, trained=1, excluded_over_length=4)
    assert batch.trajectory_valid.tolist() == [True, True]  # still in the group statistics
    wide = pack_trajectories([a], pad_token_id=PAD, max_prompt_length=6, max_response_length=5)
    assert wide.input_ids.shape == (1, 11) and wide.truncated.tolist() == [False]
    assert wide.tokens == TokenCounts(sampled=3, trained=3)


def test_failed_trajectories_are_invalid_with_zero_mask_and_reward():
    good = _traj([1], [2], [1], [-0.1], task_id="a")
    bad = _traj([1], [2, 3], [1, 1], [-0.1, -0.2], reward=0.0, failed=True, task_id="a", idx=1)
    empty = StepTrajectory(prompt_tokens=[], response_tokens=[], response_masks=[], failed=True)
    batch = pack_trajectories([good, bad, empty], pad_token_id=PAD)
    assert batch.valid.tolist() == [True, False, False]
    assert batch.response_mask[1:].sum() == 0 and batch.rewards[1:].tolist() == [0.0, 0.0]
    assert batch.tokens == TokenCounts(sampled=3, trained=1, excluded_failed=2)
    assert batch.trajectory_tokens.tolist() == [1, 2, 0]


def test_groups_follow_task_ids_or_explicit_ids():
    ts = [_traj([1], [2], [1], task_id=t, idx=i) for i, t in enumerate(["x", "y", "x", "z", "y"])]
    assert pack_trajectories(ts, pad_token_id=PAD).group_ids.tolist() == [0, 1, 0, 2, 1]
    assert pack_trajectories(ts, pad_token_id=PAD, group_ids=[7, 7, 8, 8, 9]).group_ids.tolist() == [7, 7, 8, 8, 9]
    with pytest.raises(TrajectoryError, match="group_ids"):
        pack_trajectories(ts, pad_token_id=PAD, group_ids=[1])
    with pytest.raises(TrajectoryError, match="empty"):
        pack_trajectories([], pad_token_id=PAD)


def test_plain_trajectories_without_logprobs_pack_with_zero_old_logprobs():
    t = Trajectory(prompt_tokens=[1, 2], response_tokens=[3], response_masks=[1])
    batch = pack_trajectories([t], pad_token_id=PAD)
    assert batch.old_logprobs.tolist() == [[0.0]] and batch.group_ids.tolist() == [0]
