"""Step-level rows and discounted returns."""

from __future__ import annotations

import pytest

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.steps import discounted_returns, step_rows
from agentic_rl.types import Step, StepTrajectory


def test_discounted_returns_follow_the_backward_recursion():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, 2.0], 1.0) == [3.0, 2.0]
    with pytest.raises(TrajectoryError, match="gamma"):
        discounted_returns([1.0], 1.5)


def test_continuous_trajectory_splits_into_one_row_per_turn():
    # prompt [1 2], turn 0 samples [3 4], glue [5 6], turn 1 samples [7]
    traj = StepTrajectory(prompt_tokens=[1, 2], response_tokens=[3, 4, 5, 6, 7], response_masks=[1, 1, 0, 0, 1],
                          response_logprobs=[-0.1, -0.2, 0, 0, -0.3],
                          steps=[Step(reward=0.0), Step(reward=1.0)])  # fmt: skip
    rows = step_rows(traj, gamma=0.9)
    assert [r.prompt_tokens.tolist() for r in rows] == [[1, 2], [1, 2, 3, 4, 5, 6]]
    assert [r.response_tokens.tolist() for r in rows] == [[3, 4], [7]]
    assert [r.response_logprobs.tolist() for r in rows] == [pytest.approx([-0.1, -0.2]), pytest.approx([-0.3])]
    assert [r.trajectory_reward for r in rows] == pytest.approx([0.9, 1.0])
    assert [s.mc_return for s in traj.steps] == pytest.approx([0.9, 1.0])


def test_steps_with_their_own_ids_use_them():
    steps = [Step(reward=1.0, prompt_ids=[9, 9], response_ids=[4], response_logprobs=[-1.0])]
    traj = StepTrajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], steps=steps)
    (row,) = step_rows(traj)
    assert row.prompt_tokens.tolist() == [9, 9] and row.response_tokens.tolist() == [4]


def test_more_steps_than_sampled_runs_is_an_error():
    traj = StepTrajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], steps=[Step(), Step()])
    with pytest.raises(TrajectoryError, match="runs"):
        step_rows(traj)
