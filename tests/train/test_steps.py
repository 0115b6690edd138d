"""Step-level rows and discounted returns."""

from __future__ import annotations

import pytest

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.steps import discounted_returns, step_rows
from agentic_rl.types import RunRecorder, Step, StepTrajectory, TokenRun


def test_discounted_returns_follow_the_backward_recursion():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, 2.0], 1.0) == [3.0, 2.0]
    with pytest.raises(TrajectoryError, match="gamma"):
        discounted_returns([1.0], 1.5)


def _two_turns() -> StepTrajectory:
    # prompt [1 2], turn 0 samples [3 4], glue [5 6], turn 1 samples [7]
    recorder = RunRecorder()
    recorder.start([1, 2])
    run, first = recorder.sample([3, 4], [-0.1, -0.2], 0)
    recorder.insert([5, 6])
    _, second = recorder.sample([7], [-0.3], 0)
    steps = [Step(reward=0.0, run=run, span=first), Step(reward=1.0, run=run, span=second)]
    return StepTrajectory.from_runs(recorder.runs, steps=steps)


def test_continuous_trajectory_splits_into_one_row_per_turn():
    traj = _two_turns()
    rows = step_rows(traj, gamma=0.9)
    assert [r.prompt_tokens.tolist() for r in rows] == [[1, 2], [1, 2, 3, 4, 5, 6]]
    assert [r.response_tokens.tolist() for r in rows] == [[3, 4], [7]]
    assert [r.response_logprobs.tolist() for r in rows] == [pytest.approx([-0.1, -0.2]), pytest.approx([-0.3])]
    assert [r.trajectory_reward for r in rows] == pytest.approx([0.9, 1.0])
    assert [s.mc_return for s in traj.steps] == pytest.approx([0.9, 1.0])


def test_a_step_sampled_in_an_earlier_run_uses_that_run():
    earlier = TokenRun([9, 9])
    span = earlier.sample([4], [-1.0], 0)
    last = TokenRun([1])
    last.sample([2], [-0.5], 0)
    traj = StepTrajectory.from_runs([earlier, last], steps=[Step(reward=1.0, run=earlier, span=span)])
    (row,) = step_rows(traj)
    assert row.prompt_tokens.tolist() == [9, 9] and row.response_tokens.tolist() == [4]


def test_a_step_without_a_token_run_is_an_error():
    traj = StepTrajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], steps=[Step(), Step()])
    with pytest.raises(TrajectoryError, match="run"):
        step_rows(traj)
