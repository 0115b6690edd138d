"""Unit tests of agentic_rl.types: defaults and validation of `Trajectory`, `Step`, `StepTrajectory`."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from agentic_rl.errors import AgenticRLError, ConfigError, TrajectoryError
from agentic_rl.types import Step, StepTrajectory, Trajectory, default_metrics

EXPECTED_METRICS = {
    "steps": 0,
    "toolcall_reward": 0.0,
    "res_reward": 0.0,
    "reward_time": 0.0,
    "env_time": 0.0,
    "llm_time": 0.0,
    "total_time": 0.0,
}


def make(**overrides) -> Trajectory:
    kwargs = {"prompt_tokens": [1, 2, 3], "response_tokens": [4, 5], "response_masks": [1, 0]}
    kwargs.update(overrides)
    return Trajectory(**kwargs)


# --------------------------------------------------------------------------------------------------- defaults


def test_default_metrics_is_the_documented_dict():
    metrics = default_metrics()
    assert metrics == EXPECTED_METRICS
    assert type(metrics["steps"]) is int
    assert all(type(metrics[k]) is float for k in EXPECTED_METRICS if k != "steps")


def test_default_metrics_returns_a_fresh_dict_each_call():
    a = default_metrics()
    a["steps"] = 99
    assert default_metrics()["steps"] == 0


def test_trajectory_defaults():
    traj = make()
    assert traj.idx == 0
    assert traj.trajectory_reward == 0.0
    assert traj.chat_completions == []
    assert traj.metrics == EXPECTED_METRICS
    assert traj.response_logprobs is None
    assert traj.termination_reason == ""
    assert traj.failed is False
    assert traj.error is None


def test_trajectory_mutable_defaults_are_not_shared_between_instances():
    a, b = make(), make()
    a.chat_completions.append({"role": "user", "content": "hi"})
    a.metrics["steps"] = 3
    a.metrics["extra"] = 1
    assert b.chat_completions == []
    assert b.metrics == EXPECTED_METRICS
    assert a.chat_completions is not b.chat_completions
    assert a.metrics is not b.metrics


def test_trajectory_fills_missing_default_metrics_and_keeps_given_ones():
    traj = make(metrics={"steps": 2, "custom": "x"})
    assert traj.metrics["steps"] == 2
    assert traj.metrics["custom"] == "x"
    for key, value in EXPECTED_METRICS.items():
        if key != "steps":
            assert traj.metrics[key] == value


def test_step_defaults():
    step = Step()
    assert step.chat_completions == []
    assert step.thought == ""
    assert step.action is None  # the AgentSDK API defaults action and observation to None
    assert step.observation is None
    assert step.model_response == ""
    assert step.info == {}
    assert step.reward == 0.0
    assert step.done is False
    assert step.mc_return == 0.0


def test_step_mutable_defaults_are_not_shared_between_instances():
    a, b = Step(), Step()
    a.chat_completions.append({"role": "assistant", "content": "x"})
    a.info["k"] = 1
    assert b.chat_completions == []
    assert b.info == {}


def test_step_trajectory_defaults():
    traj = StepTrajectory(prompt_tokens=[1], response_tokens=[], response_masks=[])
    assert isinstance(traj, Trajectory)
    assert traj.task is None
    assert traj.steps == []
    assert traj.idx == 0
    assert traj.trajectory_reward == 0.0
    assert traj.metrics == EXPECTED_METRICS
    assert traj.chat_completions == []


def test_step_trajectory_steps_are_not_shared_between_instances():
    a = StepTrajectory(prompt_tokens=[1], response_tokens=[], response_masks=[])
    b = StepTrajectory(prompt_tokens=[1], response_tokens=[], response_masks=[])
    a.steps.append(Step(done=True))
    assert b.steps == []


def test_step_trajectory_validates_like_trajectory():
    with pytest.raises(TrajectoryError):
        StepTrajectory(prompt_tokens=[1], response_tokens=[1, 2], response_masks=[1])


def test_trajectory_field_order_starts_with_the_three_token_tensors():
    names = [f.name for f in dataclasses.fields(Trajectory)]
    assert names[:3] == ["prompt_tokens", "response_tokens", "response_masks"]
    traj = Trajectory([1], [2], [1])
    assert traj.response_tokens.tolist() == [2]


# --------------------------------------------------------------------------------------------------- conversion


def test_trajectory_converts_lists_to_int64_tensors():
    traj = make()
    for tensor, expected in [
        (traj.prompt_tokens, [1, 2, 3]),
        (traj.response_tokens, [4, 5]),
        (traj.response_masks, [1, 0]),
    ]:
        assert isinstance(tensor, torch.Tensor)
        assert tensor.dtype == torch.int64
        assert tensor.dim() == 1
        assert tensor.tolist() == expected


def test_trajectory_converts_tuples_to_int64_tensors():
    traj = make(prompt_tokens=(7, 8))
    assert traj.prompt_tokens.dtype == torch.int64
    assert traj.prompt_tokens.tolist() == [7, 8]


def test_trajectory_accepts_empty_lists():
    traj = make(prompt_tokens=[], response_tokens=[], response_masks=[])
    assert traj.prompt_tokens.numel() == 0
    assert traj.prompt_tokens.dtype == torch.int64
    assert traj.num_generated_tokens == 0


def test_trajectory_keeps_given_int_tensors():
    tokens = torch.tensor([10, 11], dtype=torch.int64)
    traj = make(response_tokens=tokens, response_masks=torch.tensor([1, 1]))
    assert traj.response_tokens is tokens


def test_trajectory_converts_logprob_list_to_float32():
    traj = make(response_logprobs=[-0.5, 0.0])
    assert isinstance(traj.response_logprobs, torch.Tensor)
    assert traj.response_logprobs.dtype == torch.float32
    assert traj.response_logprobs.tolist() == [-0.5, 0.0]


@pytest.mark.parametrize("bad", ["abc", None, object(), [[1], [2, 3]], ["a"]])
def test_trajectory_rejects_values_that_are_not_number_lists(bad):
    with pytest.raises(TrajectoryError, match="prompt_tokens"):
        make(prompt_tokens=bad)


# --------------------------------------------------------------------------------------------------- shape


@pytest.mark.parametrize("field_name", ["prompt_tokens", "response_tokens", "response_masks"])
def test_trajectory_rejects_two_dimensional_token_tensors(field_name):
    with pytest.raises(TrajectoryError, match=rf"{field_name} must be 1-D, got shape \(1, 2\)"):
        make(**{field_name: torch.ones((1, 2), dtype=torch.long)})


def test_trajectory_rejects_two_dimensional_nested_list():
    with pytest.raises(TrajectoryError, match=r"prompt_tokens must be 1-D, got shape \(1, 3\)"):
        make(prompt_tokens=[[1, 2, 3]])


def test_trajectory_rejects_zero_dimensional_tensor():
    with pytest.raises(TrajectoryError, match="must be 1-D"):
        make(prompt_tokens=torch.tensor(5))


def test_trajectory_rejects_scalar_int():
    with pytest.raises(TrajectoryError, match="must be 1-D"):
        make(prompt_tokens=5)


def test_trajectory_rejects_two_dimensional_logprobs():
    with pytest.raises(TrajectoryError, match="response_logprobs must be 1-D"):
        make(response_logprobs=torch.zeros((2, 1)))


def test_trajectory_rejects_mask_length_mismatch():
    with pytest.raises(TrajectoryError, match="response_masks has 3 entries, response_tokens has 2"):
        make(response_masks=[1, 1, 0])


def test_trajectory_rejects_shorter_mask():
    with pytest.raises(TrajectoryError, match="response_masks"):
        make(response_masks=[1])


def test_trajectory_rejects_logprob_length_mismatch():
    with pytest.raises(TrajectoryError, match="response_logprobs has 1 entries, response_tokens has 2"):
        make(response_logprobs=[-0.1])


def test_trajectory_rejects_logprobs_longer_than_tokens():
    with pytest.raises(TrajectoryError, match="response_logprobs"):
        make(response_logprobs=torch.zeros(3))


def test_trajectory_error_is_a_value_error_not_a_config_error():
    with pytest.raises(TrajectoryError) as info:
        make(response_masks=[1])
    assert isinstance(info.value, ValueError) and isinstance(info.value, AgenticRLError)
    assert not isinstance(info.value, ConfigError)  # a bad record is not the caller's configuration


# --------------------------------------------------------------------------------------------------- NaN / Inf


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field_name", ["prompt_tokens", "response_tokens", "response_masks"])
def test_trajectory_rejects_non_finite_float_token_tensors(field_name, value):
    overrides = {
        "prompt_tokens": torch.tensor([1.0, 2.0]),
        "response_tokens": torch.tensor([4.0, 5.0]),
        "response_masks": torch.tensor([1.0, 0.0]),
    }
    overrides[field_name] = torch.tensor([1.0, value])
    with pytest.raises(TrajectoryError, match=f"{field_name} contains 1 NaN or Inf"):
        make(**overrides)


def test_trajectory_counts_every_non_finite_value():
    with pytest.raises(TrajectoryError, match="contains 3 NaN or Inf"):
        make(prompt_tokens=torch.tensor([math.nan, 1.0, math.inf, -math.inf]))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_trajectory_rejects_non_finite_logprobs_tensor(value):
    with pytest.raises(TrajectoryError, match="response_logprobs contains 1 NaN or Inf"):
        make(response_logprobs=torch.tensor([-0.1, value]))


def test_trajectory_rejects_nan_in_logprob_list():
    with pytest.raises(TrajectoryError, match="response_logprobs"):
        make(response_logprobs=[math.nan, -1.0])


def test_trajectory_rejects_nan_in_token_list():
    with pytest.raises(TrajectoryError, match="prompt_tokens"):
        make(prompt_tokens=[1, math.nan])


def test_trajectory_rejects_complex_token_tensor():
    with pytest.raises(TrajectoryError, match="must be real"):
        make(prompt_tokens=torch.tensor([complex(math.nan, 0.0)]))


def test_trajectory_accepts_finite_logprobs():
    traj = make(response_logprobs=torch.tensor([-1.25, 0.0]))
    assert traj.response_logprobs.tolist() == [-1.25, 0.0]


# --------------------------------------------------------------------------------------------------- reward


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf, float("nan")])
def test_trajectory_rejects_non_finite_reward(reward):
    with pytest.raises(TrajectoryError, match="trajectory_reward must be a finite number"):
        make(trajectory_reward=reward)


@pytest.mark.parametrize("reward", [True, False, "1.0", None, [1.0], torch.tensor(1.0)])
def test_trajectory_rejects_reward_that_is_not_a_real_number(reward):
    with pytest.raises(TrajectoryError, match="trajectory_reward"):
        make(trajectory_reward=reward)


@pytest.mark.parametrize("reward", [0, 1, -2, 0.5, -1e9])
def test_trajectory_accepts_finite_int_or_float_reward(reward):
    assert make(trajectory_reward=reward).trajectory_reward == reward


# --------------------------------------------------------------------------------------------------- derived


def test_num_generated_tokens_is_the_mask_sum():
    traj = make(response_tokens=[1, 2, 3, 4, 5], response_masks=[1, 1, 0, 0, 1])
    assert traj.num_generated_tokens == 3
    assert isinstance(traj.num_generated_tokens, int)


def test_num_generated_tokens_is_zero_for_all_inserted_tokens():
    assert make(response_masks=[0, 0]).num_generated_tokens == 0


def test_num_generated_tokens_follows_tensor_mask():
    traj = make(response_tokens=torch.arange(4), response_masks=torch.tensor([1, 1, 1, 1]))
    assert traj.num_generated_tokens == 4


def test_trajectory_converts_integer_valued_float_tokens_and_rejects_fractional_ids():
    traj = make(prompt_tokens=torch.tensor([1.0, 2.0]))
    assert traj.prompt_tokens.dtype == torch.long and traj.prompt_tokens.tolist() == [1, 2]
    with pytest.raises(TrajectoryError, match="non-integer"):
        make(prompt_tokens=[1.5])


def test_trajectory_rejects_mask_values_other_than_zero_and_one():
    with pytest.raises(TrajectoryError, match="only 0 and 1"):
        make(response_masks=torch.tensor([1, 2]))


def test_trajectory_does_not_mutate_the_metrics_dict_it_was_given():
    given = {"steps": 3}
    traj = make(metrics=given)
    assert given == {"steps": 3}
    assert traj.metrics["steps"] == 3 and traj.metrics["llm_time"] == 0.0


def test_every_termination_reason_is_produced_somewhere_in_the_package():
    from pathlib import Path

    from agentic_rl.types import TerminationReason

    root = Path(__file__).resolve().parents[1] / "agentic_rl"
    code = "\n".join(p.read_text(encoding="utf-8") for p in root.rglob("*.py") if p.name != "types.py")
    unused = [m.name for m in TerminationReason if f"TerminationReason.{m.name}" not in code]
    assert unused == []
    assert TerminationReason.TIMEOUT.aborts_a_turn and TerminationReason.ABORTED.aborts_a_turn
    assert not TerminationReason.ERROR.aborts_a_turn and TerminationReason.ENV_DONE == "env_done"
    cut = {TerminationReason.MAX_STEPS, TerminationReason.TRUNCATED, TerminationReason.CONTEXT_LIMIT}
    assert {m for m in TerminationReason if m.cut_by_limit} == cut


def test_a_token_run_takes_one_weight_version_for_all_sampled_ids_or_one_per_id():
    from agentic_rl.types import INSERTED_VERSION, TokenRun

    run = TokenRun([1, 2])
    assert run.sample([10, 11], [-0.1, -0.2], 4) == (0, 2)  # one version for all
    run.insert([7])
    assert run.sample([12, 13, 14], [-0.3, -0.4, -0.5], [4, 5, 5]) == (3, 6)  # per id: a weight update midway
    assert run.weight_versions == [4, 4, INSERTED_VERSION, 4, 5, 5]
    run.check()
    with pytest.raises(TrajectoryError, match="2 weight versions for 3 sampled ids"):
        run.sample([15, 16, 17], [-0.1] * 3, [5, 5])
    assert len(run.response_ids) == len(run.weight_versions) == 6  # nothing appended by the refused call
    unrecorded = TokenRun([1], [9], [0], None, None)  # a run without versions keeps none
    unrecorded.sample([10], [-0.1], [3])
    assert unrecorded.weight_versions is None and unrecorded.response_ids == [9, 10]
