"""Step-level rows, discounted returns and per-turn-index advantages."""

from __future__ import annotations

import pytest
import torch

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.advantages import turn_advantages
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.turn_rows import discounted_returns, step_rewards, step_rows, step_units
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


def test_discounted_returns_with_gamma_below_one_credit_later_rewards_less():
    assert discounted_returns([0.1, 0.0, 0.2, 1.0], 0.9) == pytest.approx([0.991, 0.99, 1.1, 1.0])
    assert discounted_returns([0.3, 0.5], 0.0) == [0.3, 0.5]  # gamma 0: each turn keeps its own reward
    assert discounted_returns([], 0.5) == []


def test_turn_advantages_normalize_within_group_and_turn_index():
    # (group, turn, return, valid): group 0 has three trajectories (two turns, two turns, one turn) and one invalid
    # step; group 1 has two (two turns, one turn); group 2 two one-turn trajectories with near-equal returns.
    rows = [(0, 0, 1.0, True), (0, 1, 1.0, True), (0, 0, 0.0, True), (0, 1, 0.5, True), (0, 0, 0.5, True),
            (0, 0, 100.0, False), (1, 0, 2.0, True), (1, 1, 3.0, True), (1, 0, 0.0, True), (2, 0, 0.0, True),
            (2, 0, 0.1, True)]  # fmt: skip
    groups, turns, returns, valid = (torch.tensor(c) for c in zip(*rows, strict=True))
    eps = 1e-6
    s00 = (1 / 6) ** 0.5  # population std of [1, 0, 0.5]
    expected = [0.5 / (s00 + eps), 0.25 / (0.25 + eps), -0.5 / (s00 + eps), -0.25 / (0.25 + eps), 0.0, 0.0,
                1 / (1 + eps), 0.0, -1 / (1 + eps), -0.05 / (0.1 + eps), 0.05 / (0.1 + eps)]  # fmt: skip
    got = turn_advantages(returns, groups, turns, valid)
    assert got.dtype == torch.float32 and got.tolist() == pytest.approx(expected, abs=1e-6)
    unscaled = turn_advantages(returns, groups, turns, valid, scale_by_std=False)
    assert unscaled.tolist() == pytest.approx([0.5, 0.25, -0.5, -0.25, 0.0, 0.0, 1.0, 0.0, -1.0, -0.05, 0.05])
    with pytest.raises(TrajectoryError, match="equal 1-D shapes"):
        turn_advantages(returns, groups, turns[:3], valid)


def _turns(idx: int, rewards: list[float], task_id: str, *, failed: bool = False) -> StepTrajectory:
    """One run; turn k samples k + 2 ids, followed by 3 glue ids (mask 0)."""
    recorder, steps = RunRecorder(), []
    recorder.start([1, 2, 3])
    for k, reward in enumerate(rewards):
        run, span = recorder.sample([10 + k] * (k + 2), [-0.5] * (k + 2), idx)
        steps.append(Step(reward=reward, run=run, span=span))
        recorder.insert([7, 8, 9])
    return StepTrajectory.from_runs(recorder.runs, idx=idx, trajectory_reward=sum(rewards), steps=steps,
                                    task={"id": task_id}, failed=failed)  # fmt: skip


def test_step_units_give_one_row_per_step_and_account_for_every_sampled_token():
    plain = StepTrajectory(prompt_tokens=[1, 2], response_tokens=[5, 6], response_masks=[1, 1], idx=4,
                           trajectory_reward=0.5, task={"id": "a"})  # no step records: trained as one step
    trajs = [_turns(0, [0.0, 1.0], "a"), _turns(1, [0.5, 0.0, 0.0], "a"), _turns(2, [1.0], "a", failed=True), plain,
             _turns(3, [0.0, 0.0], "b")]  # fmt: skip
    units = step_units(trajs, gamma=0.5)
    assert units.turns == [0, 1, 0, 1, 2, 0, 0, 0, 1] and units.owners == [0, 0, 1, 1, 1, 2, 3, 4, 4]
    assert units.group_ids == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert [u.trajectory_reward for u in units.units] == [0.5, 1.0, 0.5, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0]
    assert [s.mc_return for s in trajs[0].steps] == [0.5, 1.0]
    assert units.units[5] is trajs[2] and units.units[6] is plain  # the failed one is excluded whole
    assert units.rewards == [1.0, 0.5, 0.5, 0.0] and units.lengths == [5, 9, 2, 5]
    batch = pack_trajectories(units.units, pad_token_id=0, group_ids=units.group_ids)
    assert batch.tokens.sampled == sum(t.num_generated_tokens for t in trajs) == 23
    assert batch.tokens.trained == 21 and batch.tokens.excluded_failed == 2
    assert batch.tokens.sampled == batch.tokens.trained + batch.tokens.excluded
    for row, unit in enumerate(units.units[:5]):  # each step row: its exact context, then only its sampled ids
        step = trajs[units.owners[row]].steps[units.turns[row]]
        mask = batch.response_mask[row].bool()
        assert batch.responses[row][mask].tolist() == step.response_ids == unit.response_tokens.tolist()
        assert batch.input_ids[row][batch.attention_mask[row].bool()].tolist() == step.prompt_ids + step.response_ids
    assert step_units(trajs, gamma=1.0).units[1].trajectory_reward == 1.0
    unrewarded = _turns(0, [0.0, 0.0, 0.0], "a")  # steps built without rewards: the trajectory's goes to the last
    unrewarded.trajectory_reward = 0.8
    assert [u.trajectory_reward for u in step_units([unrewarded], gamma=0.5).units] == [0.2, 0.4, 0.8]
    assert [s.reward for s in unrewarded.steps] == [0.0, 0.0, 0.0]  # the record is left as it is
    unrewarded.credited = True  # the harness's credit is read as it is, even all zero (a milestone and a penalty)
    assert step_rewards(unrewarded) == [0.0, 0.0, 0.0]
    assert [u.trajectory_reward for u in step_units([unrewarded], gamma=0.5).units] == [0.0, 0.0, 0.0]
    bad = _turns(0, [0.0, 1.0], "a")
    bad.steps[1].reward = float("nan")
    with pytest.raises(TrajectoryError, match="trajectory 0, step 1: reward must be a finite number, got nan"):
        step_units([bad])


def test_step_settings_are_refused_by_name():
    from agentic_rl.errors import ConfigError
    from agentic_rl.train.trainer import GRPOConfig

    assert (GRPOConfig().advantage, GRPOConfig().gamma) == ("trajectory", 1.0)
    assert GRPOConfig(advantage="step", gamma=0).gamma == 0.0
    for bad, message in (({"advantage": "turn"}, "GRPOConfig.advantage='turn'.*'trajectory' or 'step'"),
                         ({"gamma": 1.5}, "GRPOConfig.gamma=1.5"), ({"gamma": -0.1}, "GRPOConfig.gamma=-0.1"),
                         ({"gamma": float("nan")}, "GRPOConfig.gamma=nan"), ({"gamma": True}, "boolean")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            GRPOConfig(**bad)
