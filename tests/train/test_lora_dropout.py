"""LoRA dropout is noise in the gradient, not a change of policy: the importance weights of off-policy correction
(pi_prox / pi_behav) come from the model's forward without dropout."""

from __future__ import annotations

import copy

import pytest
import torch

from agentic_rl.train.lora import LoRAConfig, adapter_model
from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.off_policy import OffPolicyConfig
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer, has_dropout
from agentic_rl.types import StepTrajectory, TokenRun


def _trajectories(n: int = 4) -> list[StepTrajectory]:
    trajectories = []
    for idx in range(n):
        ids = torch.randint(100, 4000, (12,), generator=torch.Generator().manual_seed(idx)).tolist()
        run = TokenRun(ids[:4], ids[4:], [1] * 8, [-10.0] * 8, [0] * 8)
        trajectories.append(StepTrajectory.from_runs([run], idx=idx, trajectory_reward=float(idx % 2), task={"id": "t"}))
    return trajectories


def _on_policy(trainer: GRPOTrainer, trajectories: list[StepTrajectory]) -> list[StepTrajectory]:
    """The trajectories with the engine logprobs the trainer's policy itself gives, without dropout: on-policy."""
    batch = pack_trajectories(trajectories, pad_token_id=2)
    policy = adapter_model(trainer.model)
    policy.eval()
    with torch.no_grad():
        logprobs = response_logprobs(policy, batch)
    policy.train()
    out = []
    for row, trajectory in enumerate(trajectories):
        run = trajectory.runs[0]
        recorded = logprobs[row, : len(run.response_ids)].tolist()
        fresh = TokenRun(run.prompt_ids, run.response_ids, run.response_mask, recorded, run.weight_versions)
        out.append(StepTrajectory.from_runs([fresh], idx=trajectory.idx, trajectory_reward=trajectory.trajectory_reward,
                                            task=trajectory.task))  # fmt: skip
    return out


def _trainer(tiny, dropout: float) -> GRPOTrainer:
    config = GRPOConfig(lr=1e-3, micro_batch_size=4, off_policy=OffPolicyConfig(correction="tis", tis_cap=1.0),
                        lora=LoRAConfig(rank=8, alpha=64.0, dropout=dropout, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    trainer = GRPOTrainer(copy.deepcopy(tiny), pad_token_id=2, config=config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():  # a trained adapter: B != 0, so that dropout on its input changes the output
        for name, parameter in trainer.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return trainer


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_on_policy_data_has_importance_weight_one_whatever_the_lora_dropout(tiny, dropout):
    trainer = _trainer(tiny, dropout)
    assert trainer.stochastic == (dropout > 0) == has_dropout(trainer.module)
    trajectories = _on_policy(trainer, _trajectories())
    # the training forward itself is noisy under dropout: its logprobs differ from the recorded ones
    batch = pack_trajectories(trajectories, pad_token_id=2)
    trainer.model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        noisy = response_logprobs(adapter_model(trainer.model), batch)
    on = batch.response_mask.bool()
    assert ((noisy - batch.old_logprobs)[on].abs().max().item() > 1e-3) == (dropout > 0)

    stats = trainer.train_step(trajectories).as_metrics()
    # pi_prox = pi_behav on every token: w = 1, nothing truncated at a cap of 1, no engine-trainer gap reported
    assert stats["is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["logprob_diff"] < 1e-4
    assert stats["grad_norm"] > 0
