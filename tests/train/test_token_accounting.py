"""Every sampled token reaches the loss exactly once, in the context it was sampled in, or is counted as excluded."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from agentic_rl.errors import TrajectoryError
from agentic_rl.train.advantages import batch_advantages, group_advantages
from agentic_rl.train.packing import PackedBatch, TokenCounts, exclusion_reason, pack_trajectories
from agentic_rl.types import RunRecorder, Step, StepTrajectory, TokenRun

PAD = 0


def sampled_in_context(batch: PackedBatch) -> Counter:
    """(context ids, token id, old logprob) for every token that enters the loss, read back from the batch."""
    out: Counter = Counter()
    p = batch.prompt_width
    for b in range(batch.input_ids.shape[0]):
        real = batch.attention_mask[b].bool()
        for j in torch.nonzero(batch.response_mask[b]).flatten().tolist():
            context = batch.input_ids[b, : p + j][real[: p + j]].tolist()
            out[(tuple(context), int(batch.responses[b, j]), round(float(batch.old_logprobs[b, j]), 6))] += 1
    return out


def sampled_by_steps(trajectory: StepTrajectory) -> Counter:
    """The same triples as the engine saw them: each step's exact prompt, then its sampled ids one by one."""
    out: Counter = Counter()
    for step in trajectory.steps:
        for j, token in enumerate(step.response_ids):
            context = tuple(step.prompt_ids + step.response_ids[:j])
            out[(context, token, round(float(torch.tensor(step.response_logprobs[j])), 6))] += 1
    return out


def rewritten(idx: int = 0, *, reward: float = 1.0, task_id: str = "q", **kwargs) -> StepTrajectory:
    """Four turns in two runs: memory rewrote the history (a summary [30, 31]) before turn 2.

    run 1: prompt [1 2 3] | turn 0 samples [10 11] | glue [20 21] | turn 1 samples [12]
    run 2: prompt [1 2 30 31] | turn 2 samples [13 14] | glue [22] | turn 3 samples [15 16 17]
    The top-level fields hold run 2, as the harness records it.
    """
    recorder = RunRecorder()
    steps = []
    recorder.start([1, 2, 3])
    for ids, logprobs, glue in (([10, 11], [-0.1, -0.2], [20, 21]), ([12], [-0.3], None)):
        run, span = recorder.sample(ids, logprobs, 0)
        steps.append(Step(run=run, span=span, info={"sampled_tokens": len(ids)}))
        if glue:
            recorder.insert(glue)
    recorder.start([1, 2, 30, 31])
    for ids, logprobs, glue in (([13, 14], [-0.4, -0.5], [22]), ([15, 16, 17], [-0.6, -0.7, -0.8], None)):
        run, span = recorder.sample(ids, logprobs, 1)
        steps.append(Step(run=run, span=span))
        if glue:
            recorder.insert(glue)
    return StepTrajectory.from_runs(recorder.runs, steps=steps, idx=idx, trajectory_reward=reward,
                                    task={"id": task_id}, **kwargs)  # fmt: skip


def continuous(idx: int, *, reward: float, task_id: str = "q", n: int = 2, **kwargs) -> StepTrajectory:
    return StepTrajectory(prompt_tokens=[1, 2, 3], response_tokens=[40 + k for k in range(n)], response_masks=[1] * n,
                          response_logprobs=[-1.0] * n, idx=idx, trajectory_reward=reward, task={"id": task_id},
                          steps=[Step()], **kwargs)  # fmt: skip


def test_the_recorder_keeps_each_run_exact_and_the_steps_point_into_them():
    traj = rewritten()
    runs = traj.token_runs()
    assert [r.prompt_ids for r in runs] == [[1, 2, 3], [1, 2, 30, 31]]
    assert [r.response_ids for r in runs] == [[10, 11, 20, 21, 12], [13, 14, 22, 15, 16, 17]]
    assert [r.response_mask for r in runs] == [[1, 1, 0, 0, 1], [1, 1, 0, 1, 1, 1]]
    assert runs[0].response_logprobs == pytest.approx([-0.1, -0.2, 0, 0, -0.3])
    assert runs[1].response_logprobs == pytest.approx([-0.4, -0.5, 0, -0.6, -0.7, -0.8])
    assert [r.weight_versions for r in runs] == [[0, 0, -1, -1, 0], [1, 1, -1, 1, 1, 1]]
    assert traj.prompt_tokens.tolist() == [1, 2, 30, 31] and traj.num_generated_tokens == 8
    assert [s.prompt_ids for s in traj.steps] == [[1, 2, 3], [1, 2, 3, 10, 11, 20, 21], [1, 2, 30, 31],
                                                  [1, 2, 30, 31, 13, 14, 22]]  # fmt: skip
    assert [s.response_ids for s in traj.steps] == [[10, 11], [12], [13, 14], [15, 16, 17]]
    one = continuous(0, reward=1.0)
    (run,) = one.token_runs()
    assert (run.prompt_ids, run.response_ids, run.weight_versions) == ([1, 2, 3], [40, 41], None)


def test_every_run_is_packed_and_each_sampled_token_appears_exactly_once_in_its_context():
    traj = rewritten()
    batch = pack_trajectories([traj], pad_token_id=PAD)
    assert batch.input_ids.shape[0] == 2 and batch.row_trajectory.tolist() == [0, 0]
    assert sampled_in_context(batch) == sampled_by_steps(traj)
    assert sum(sampled_by_steps(traj).values()) == 8
    assert batch.tokens == TokenCounts(sampled=8, trained=8)
    assert batch.trajectory_tokens.tolist() == [8]


def test_a_trajectory_with_several_runs_weighs_once_in_its_group():
    trajs = [rewritten(0, reward=1.0), continuous(1, reward=0.0), continuous(2, reward=0.0)]
    batch = pack_trajectories(trajs, pad_token_id=PAD)
    assert batch.row_trajectory.tolist() == [0, 0, 1, 2]
    adv = batch_advantages(batch)
    # per trajectory: mean 1/3, std sqrt(2)/3 -> +sqrt(2) for the rewarded one, -1/sqrt(2) for the others
    expected = [math.sqrt(2)] * 2 + [-1 / math.sqrt(2)] * 2
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)
    # Statistics over rows would count the rewarded trajectory twice: mean 1/2, std 1/2 -> +-1.
    per_row = group_advantages(batch.rewards, batch.group_ids, batch.valid)
    assert per_row.tolist() == pytest.approx([1.0, 1.0, -1.0, -1.0], rel=1e-5)


def test_sampled_equals_trained_plus_excluded_for_every_reason():
    good = rewritten(0, reward=1.0)  # 8 sampled, all trained
    failed = rewritten(1, reward=0.0, failed=True, error="EnvStepError: boom")  # 8 failed
    timeout = continuous(2, reward=0.0, n=5, failed=True, termination_reason="timeout")  # 5 aborted
    abort_turn = continuous(3, reward=1.0, n=3)  # not marked failed, but its only turn was aborted: 3 aborted
    abort_turn.steps = [Step(info={"finish_reason": "abort", "sampled_tokens": 3})]
    # A record whose logprobs were invalid (e.g. a NaN): the harness keeps its ids without logprobs. 4 failed.
    wiped = StepTrajectory.from_runs([TokenRun([1], [5, 6, 7, 8], [1, 1, 1, 1], None, None)], failed=True, idx=4,
                                     steps=[Step(info={"sampled_tokens": 4})])  # fmt: skip
    long = continuous(5, reward=0.0, n=6)  # cut to 4 response tokens: 4 trained, 2 over length
    refused = continuous(6, reward=1.0, n=7, failed=True)  # the trainer refused its record: 7 refused
    refused.refused = "token 3 differs from what the engine sampled"
    trajs = [good, failed, timeout, abort_turn, wiped, long, refused]
    assert [exclusion_reason(t) for t in trajs] == [None, "failed", "aborted", "aborted", "failed", None, "refused"]
    # the turn loop's own reason for a turn the engine aborted
    assert exclusion_reason(continuous(6, reward=0.0, n=2, failed=True, termination_reason="aborted")) == "aborted"

    batch = pack_trajectories(trajs, pad_token_id=PAD, max_response_length=4)
    # good's run 1 keeps [10 11 20 21] (2 sampled, [12] over length), run 2 keeps [13 14 22 15] (3 sampled, [16 17]
    # over length); long keeps 4 of its 6. Failed: 8 + the wiped record's 4; aborted: 5 + 3.
    expected = TokenCounts(sampled=41, trained=2 + 3 + 4, excluded_failed=12, excluded_aborted=8, excluded_refused=7,
                           excluded_over_length=1 + 2 + 2)  # fmt: skip
    assert batch.tokens == expected
    assert expected.sampled == expected.trained + expected.excluded
    assert int(batch.response_mask.sum()) == expected.trained
    assert batch.trajectory_valid.tolist() == [True, False, False, False, False, True, False]
    assert batch.trajectory_tokens.tolist() == [8, 8, 5, 3, 4, 6, 7]
    assert batch.tokens.as_metrics() == {
        "tokens_sampled": 41, "tokens_trained": 9, "tokens_excluded": 32, "tokens_excluded_failed": 12,
        "tokens_excluded_aborted": 8, "tokens_excluded_refused": 7, "tokens_excluded_over_length": 5,
        "tokens_excluded_overlong": 0,
    }  # fmt: skip
    unlimited = pack_trajectories(trajs, pad_token_id=PAD)
    assert unlimited.tokens == TokenCounts(sampled=41, trained=14, excluded_failed=12, excluded_aborted=8,
                                           excluded_refused=7)  # fmt: skip


def test_excluded_trajectories_are_left_out_of_group_statistics():
    trajs = [rewritten(0, reward=1.0), continuous(1, reward=0.0), continuous(2, reward=5.0, n=1)]
    trajs[2].steps = [Step(info={"finish_reason": "abort"})]
    adv = batch_advantages(pack_trajectories(trajs, pad_token_id=PAD))
    assert adv.tolist() == pytest.approx([1.0, 1.0, -1.0, 0.0], abs=1e-5)  # the aborted one: 0, not in mean/std


def test_an_inconsistent_token_run_is_an_error_not_a_silent_loss():
    short = TokenRun([1], [2, 3], [1, 1], [-0.6], [0, 0])
    with pytest.raises(TrajectoryError, match="response_logprobs has 1 entries"):
        StepTrajectory.from_runs([short])
    with pytest.raises(TrajectoryError, match="2 logprobs for 1 sampled ids"):
        TokenRun([1]).sample([2], [-0.1, -0.2], 0)
    with pytest.raises(TrajectoryError, match="equal the last of `runs`"):
        StepTrajectory(prompt_tokens=[9], response_tokens=[], response_masks=[], runs=[TokenRun([1])])
    with pytest.raises(TrajectoryError, match="does not extend"):
        recorder = RunRecorder()
        recorder.start([1, 2])
        recorder.extend_to([1, 3, 4])


class _EngineSummaryClient:
    """Summaries written by the real engine itself (the text is whatever the model writes)."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine, self.tokenizer, self.calls = engine, tokenizer, 0

    async def summarize(self, messages, *, system_prompt, max_tokens):
        from agentic_rl.memory import to_template_messages

        chat = [{"role": "system", "content": system_prompt}, *to_template_messages(messages)]
        rendered = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt = self.tokenizer.encode(rendered, add_special_tokens=False)
        out = await self.engine.generate(prompt, {"max_tokens": max_tokens, "temperature": 0.7, "seed": self.calls})
        self.calls += 1
        return "Notes: " + self.tokenizer.decode(out.token_ids, skip_special_tokens=True)


async def test_a_summarizing_rollout_on_the_real_engine_is_packed_run_by_run(engine, tokenizer):
    from support.engines import ForcedCallEngine

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.environments.tool_env import ToolEnvironment
    from agentic_rl.memory import MemoryConfig, MemorySummary
    from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
    from agentic_rl.rollout.spec import RolloutSpec
    from agentic_rl.tools.calculator import CalculatorTool

    config = MemoryConfig(use_summary=True, max_prompt_length=420, max_summary_length=32, before_raw_message=2,
                          end_raw_message=-2)  # fmt: skip
    client = _EngineSummaryClient(engine, tokenizer)
    forced = ForcedCallEngine(engine, tokenizer, forced_turns=100)  # keeps calling tools: the history grows
    traj = await run_trajectory({"id": "long", "question": "Add up 12 + 30, then keep checking it with the calculator.", "ground_truth": "42"}, 0, RolloutSpec(engine=forced, environment=ToolEnvironment([CalculatorTool()]), renderer=ChatRenderer(tokenizer), config=HarnessConfig(max_steps=6, max_prompt_length=1024, max_response_length=1024,
                             sampling={"temperature": 0.7, "max_tokens": 96}), memory_factory=lambda: MemorySummary(config, chat_client=client, tokenizer=tokenizer)))  # fmt: skip
    assert not traj.failed, traj.error
    assert traj.metrics["summaries"] >= 1 and len(traj.runs) > 1
    assert [(s.prompt_ids, s.response_ids) for s in traj.steps] == [(p, g.token_ids) for p, _, g in forced.calls]

    batch = pack_trajectories([traj], pad_token_id=tokenizer.pad_token_id)
    runs = traj.token_runs()
    assert len(runs) >= 2 and batch.input_ids.shape[0] == len(runs)
    # the top level holds only the last run; packing trains them all
    assert int(traj.response_masks.sum()) < batch.tokens.sampled == traj.metrics["generated_tokens"]
    assert traj.num_generated_tokens == batch.tokens.sampled
    assert batch.tokens == TokenCounts(
        sampled=traj.metrics["generated_tokens"], trained=traj.metrics["generated_tokens"]
    )
    assert sampled_in_context(batch) == sampled_by_steps(traj)  # each sampled token once, in its exact context
    assert runs[-1].prompt_ids == traj.prompt_tokens.tolist()
    assert runs[-1].response_ids == traj.response_tokens.tolist()


def test_a_run_that_sampled_nothing_gives_no_row():
    # memory rewrote the history, then no room was left: the last run has a prompt and no response
    traj = rewritten()
    empty = TokenRun([1, 2, 40, 41, 42])
    traj = StepTrajectory.from_runs([*traj.runs, empty], steps=traj.steps, task={"id": "q"})
    batch = pack_trajectories([traj], pad_token_id=PAD, max_prompt_length=4)
    assert batch.input_ids.shape[0] == 2 and not bool(batch.truncated.any())
    assert batch.tokens == TokenCounts(sampled=8, trained=8)


def test_overlong_filtering_masks_the_loss_of_cut_trajectories_and_keeps_their_rewards():
    """DAPO's overlong filtering: a trajectory a length limit cut trains none of its tokens (counted as `overlong`)
    but its reward stays in its group's mean and std; with the option off the batch is the same as without it."""
    trajs = [rewritten(0, reward=1.0, termination_reason="truncated"), continuous(1, reward=0.0),
             continuous(2, reward=0.5, n=3, termination_reason="context_limit"), continuous(3, reward=1.0, n=4),
             continuous(4, reward=0.0, n=5, failed=True, termination_reason="truncated")]  # fmt: skip
    off = pack_trajectories(trajs, pad_token_id=PAD)
    assert off.tokens == TokenCounts(sampled=22, trained=17, excluded_failed=5)
    assert pack_trajectories(trajs, pad_token_id=PAD, overlong_filter=False).tokens == off.tokens
    on = pack_trajectories(trajs, pad_token_id=PAD, overlong_filter=True)
    assert on.tokens == TokenCounts(sampled=22, trained=2 + 4, excluded_failed=5, excluded_overlong=8 + 3)
    assert on.tokens.sampled == on.tokens.trained + on.tokens.excluded
    assert on.tokens.as_metrics()["tokens_excluded_overlong"] == 11
    trained = sampled_in_context(on)
    assert sum(trained.values()) == 6 and all(token in (40, 41, 42, 43) for _, token, _ in trained)
    cut = pack_trajectories([trajs[0], trajs[2]], pad_token_id=PAD)
    assert sampled_in_context(off) - trained == sampled_in_context(cut)  # exactly the cut ones' tokens are left out
    # the cut trajectories stay valid: the group's statistics, and so every advantage, are those without filtering
    assert on.trajectory_valid.tolist() == off.trajectory_valid.tolist() == [True, True, True, True, False]
    assert batch_advantages(on)[on.row_trajectory != 0].tolist() == pytest.approx(
        batch_advantages(off)[off.row_trajectory != 0].tolist())  # fmt: skip
    per_trajectory = group_advantages(on.trajectory_rewards, on.trajectory_group_ids, on.trajectory_valid)
    assert per_trajectory[0] > 0 and per_trajectory[1] < 0  # the truncated one's reward of 1 raised the mean
    assert not on.response_mask[torch.isin(on.row_trajectory, torch.tensor([0, 2]))].any()  # no token of theirs trains
