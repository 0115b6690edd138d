"""GRPO trainer: packed trajectories -> one optimizer step on the training model -> weights for the engines."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from agentic_rl.config import Config
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.train.advantages import batch_advantages
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.logprobs import SamplingDistribution
from agentic_rl.train.lora import LoRAConfig, adapter_model, save_adapter, wrap_model
from agentic_rl.train.loss import LossOutput, grpo_loss, response_logprobs
from agentic_rl.train.off_policy import OffPolicyConfig, lag_sums
from agentic_rl.train.optim import adamw, learning_rates, load_optimizer_state
from agentic_rl.train.packing import PackedBatch, pack_trajectories
from agentic_rl.train.step_stats import LossSums, StepStats
from agentic_rl.train.turn_rows import step_units
from agentic_rl.types import Trajectory

__all__ = ["GRPOConfig", "GRPOTrainer"]

logger = logging.getLogger(__name__)


class GRPOConfig(Config):
    """Optimizer and loss settings.

    Attributes:
        lr: AdamW learning rate (the peak one under a schedule).
        lr_schedule: `constant` (default) or `cosine`: the learning rate of optimizer step k (0-based) falls from `lr`
            along half a cosine towards `lr * min_lr_ratio`, reached at step `lr_decay_steps` and kept after it
            (Loshchilov & Hutter 2017, "SGDR", without restarts; `train.optim.learning_rates`). Either schedule rises
            linearly from 0 over `lr_warmup_steps` first (step k < warmup trains at `lr * k / warmup`).
        lr_warmup_steps: optimizer steps of linear warmup (0: none); the first trains at rate 0, so its rollout
            changes no weight (in RL each step is a whole rollout: keep W small).
        min_lr_ratio: the cosine's floor as a fraction of `lr`, in [0, 1]; `cosine` only.
        lr_decay_steps: the 0-based optimizer step at which the cosine reaches its floor, warmup included; `cosine`
            only. None: a training run takes its `steps`, so its last step (`steps` - 1) has come
            (steps - 1 - W) / (steps - W) of the way down (W the warmup; all but the shortest runs end near the
            floor); a trainer built alone refuses a cosine without it (`ConfigError`).
        weight_decay: AdamW weight decay.
        clip_low / clip_high: ratio clip range of the policy loss.
        clip_ratio_c: dual-clip bound (> 1) on the ratio of negative-advantage tokens (Ye et al. 2020; see
            `grpo_loss`).
        kl_coef: weight of the k3 KL to the reference (the model at the start of training); 0 = no reference.
        loss_agg_mode: `token-mean` or `sequence-mean` (a trajectory's runs form one sequence).
        scale_by_std: GRPO's division by the group std (False: mean baseline only).
        std_floor: floor on the group std.
        max_grad_norm: gradient clipping norm.
        micro_batch_size: rows per forward/backward (gradients are accumulated over the batch); with
            `sequence-mean` a trajectory's runs stay in one micro-batch, which may then hold more rows.
        max_prompt_length / max_response_length: packing widths in tokens (None: the longest in the batch). A run
            whose prompt is longer is left out; a longer response keeps its first tokens. Cut sampled tokens are
            counted in `tokens_excluded_over_length`.
        overlong_filter: leave out of the loss every trajectory a length limit cut (termination reason `truncated`
            or `context_limit`); it still enters its group's reward statistics, and its sampled tokens are counted
            in `tokens_excluded_overlong` (Yu et al. 2025, "DAPO", section 3.4: overlong filtering; `is_overlong`).
        max_consecutive_skips: `train_step` raises `TrainingError` when this many optimizer steps in a row were
            skipped for a non-finite gradient norm.
        off_policy: the correction for tokens the engine sampled with other weights or another precision than the
            trainer's (decoupled PPO with a truncated or masked importance weight; `train.off_policy`). `none` is
            plain PPO on the ratio to the engine's logprobs. With `sequence`-level masking a trajectory's runs stay
            in one micro-batch, as with `sequence-mean`.
        advantage: `trajectory` (default): every token of a trajectory gets its trajectory's group-relative
            advantage. `step`: each turn of a trajectory is its own row (its exact prompt: the run's prompt and
            everything before the turn; its sampled ids), rewarded with its discounted return from `Step.reward`
            (`train.turn_rows.step_units`), and normalized within its task group per turn index (`turn_advantages`).
            In step mode a row is a sequence of its own (`sequence-mean`, `sequence`-level masking), and the widths
            apply to each row: a late turn's prompt holds the turns before it.
        gamma: discount of the step returns in `step` mode, in [0, 1] (1: each turn is credited with every reward
            from it to the end); not used in `trajectory` mode.
        lora: train a LoRA adapter on the frozen model instead of every weight (`train.lora.LoRAConfig`); the KL
            reference is then the same model with its adapter disabled. None (default): full fine-tuning.
    """

    lr: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_warmup_steps: int = Field(default=0, ge=0, strict=True)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    lr_decay_steps: int | None = Field(default=None, ge=1, strict=True)
    weight_decay: float = Field(default=0.0, ge=0)
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.2, ge=0)
    clip_ratio_c: float = Field(default=3.0, gt=1)
    kl_coef: float = Field(default=0.0, ge=0)
    loss_agg_mode: Literal["token-mean", "sequence-mean"] = "token-mean"
    scale_by_std: bool = True
    std_floor: float = Field(default=0.1, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=4, ge=1)
    max_prompt_length: int | None = Field(default=None, ge=1)
    max_response_length: int | None = Field(default=None, ge=1)
    overlong_filter: bool = False
    max_consecutive_skips: int = Field(default=3, ge=1)
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig)
    advantage: Literal["trajectory", "step"] = "trajectory"
    gamma: float = Field(default=1.0, ge=0, le=1)
    lora: LoRAConfig | None = None

    @model_validator(mode="after")
    def _schedule_is_consistent(self) -> GRPOConfig:
        cosine_only = {"min_lr_ratio": self.min_lr_ratio or None, "lr_decay_steps": self.lr_decay_steps}
        given = [f"{name}={value:g}" for name, value in cosine_only.items() if value is not None]
        if self.lr_schedule == "constant" and given:
            one = len(given) == 1
            raise ValueError(
                f"{' and '.join(given)} only shape{'s' * one} the cosine schedule: set lr_schedule: "
                f"cosine, or remove {'it' if one else 'them'}"
            )
        if (
            self.lr_schedule == "cosine"
            and self.lr_decay_steps is not None
            and self.lr_warmup_steps >= self.lr_decay_steps
        ):
            raise ValueError(
                f"lr_warmup_steps={self.lr_warmup_steps} must be below lr_decay_steps="
                f"{self.lr_decay_steps}: the cosine decays after the warmup"
            )
        return self


def _micro_batches(
    rows: torch.Tensor, owner: torch.Tensor, size: int, *, whole_trajectories: bool
) -> list[torch.Tensor]:
    """Split row indices into chunks of at most `size` rows; with `whole_trajectories`, a trajectory's rows
    (same `owner`) are never split (a chunk may then exceed `size`)."""
    if not rows.numel():
        return []
    if not whole_trajectories:
        return list(torch.split(rows, size))
    chunks: list[list[int]] = [[]]
    owners = owner[rows].tolist()
    for start, row in enumerate(rows.tolist()):
        if start and owners[start] == owners[start - 1]:
            chunks[-1].append(row)
            continue
        span = owners.count(owners[start])
        if chunks[-1] and len(chunks[-1]) + span > size:
            chunks.append([])
        chunks[-1].append(row)
    return [torch.tensor(c, dtype=torch.long, device=rows.device) for c in chunks]


@dataclass(frozen=True, slots=True)
class _StepRows:
    """Which rows of a packed batch one step trains, and the counts that normalize its loss.

    Attributes:
        rows: (N,) int64, valid rows with at least one response token; all of them count in the normalizers.
        computed: (M,) int64, the rows of `rows` whose forward runs (all of them with a KL term, else those whose
            advantage is not 0).
        total_tokens: response tokens of `rows` (this rank's).
        total_sequences: trajectories `rows` belong to (this rank's).
        computed_tokens: response tokens of `computed`.
        global_tokens, global_sequences: `total_tokens` and `total_sequences` summed over every rank.
        world_size: ranks whose gradients are averaged (1 without a `DistContext`).
    """

    rows: torch.Tensor
    computed: torch.Tensor
    total_tokens: float
    total_sequences: int
    computed_tokens: float
    global_tokens: float
    global_sequences: float
    world_size: int

    @classmethod
    def of(cls, batch: PackedBatch, advantages: torch.Tensor, *, with_kl: bool, dist: DistContext | None) -> _StepRows:
        """The rows of `batch` to train, given each row's (B,) float32 advantage and whether the loss has a KL term;
        every rank of `dist` must call it (the global counts are one all-reduce)."""
        rows = torch.nonzero(batch.valid & (batch.response_mask.sum(-1) > 0)).flatten()
        # Without a KL term a row whose advantage is 0 adds exactly 0 to the loss and its gradient: skip its forward.
        # The normalizers still count it, so the step is the same as with the row.
        computed = rows if with_kl else rows[advantages[rows] != 0]
        tokens = float(batch.response_mask[rows].sum())
        sequences = int(torch.unique(batch.row_trajectory[rows]).numel())
        dist = dist or DistContext()
        global_tokens, global_sequences = dist.allreduce_sum([tokens, float(sequences)])
        return cls(
            rows=rows,
            computed=computed,
            total_tokens=tokens,
            total_sequences=sequences,
            computed_tokens=float(batch.response_mask[computed].sum()),
            global_tokens=global_tokens,
            global_sequences=global_sequences,
            world_size=dist.world_size,
        )

    def loss_normalizer(self, loss_agg_mode: str) -> float:
        """`grpo_loss`'s `normalizer` for every micro-batch of this rank: N / W, with N the response tokens
        (`token-mean`) or sequences (`sequence-mean`) of all ranks and W the world size.

        A micro-batch's loss is then (W / N) times its sum over its tokens (or sequences' token means); the
        micro-batches add up to the rank's share and the ranks' average to the step's loss (`DistContext`).
        """
        count = self.global_tokens if loss_agg_mode == "token-mean" else self.global_sequences
        return max(count, 1.0) / self.world_size

    def report_weights(self, loss_agg_mode: str, micro: PackedBatch) -> tuple[float, float]:
        """What turns a micro-batch's `LossOutput` into its part of this rank's reported means: the factor of its
        loss (normalized by `loss_normalizer`) and its share of the rank's response tokens (for the clip shares)."""
        token_share = float(micro.response_mask.sum()) / self.total_tokens
        count = self.total_tokens if loss_agg_mode == "token-mean" else self.total_sequences
        return self.loss_normalizer(loss_agg_mode) / count, token_share


class GRPOTrainer:
    """Owns the training model and its optimizer.

    Args:
        model: a `transformers` causal LM (fp32 recommended on the CPU), or a DDP wrapper of one.
        pad_token_id: padding id for packing.
        config: optimizer and loss settings.
        reference: a frozen copy of the initial model for the KL term (built when `kl_coef > 0` and None; with
            `config.lora`, the model itself with its adapter disabled, no copy).
        dist: the data-parallel context under torchrun: the loss is normalized by the response tokens (or
            sequences) of all its ranks and the gradients are averaged across them (`_accumulate_gradients`). A DDP
            wrapper's ranks need it too; without it the normalizers count this process's rows only.
        sampling: the distribution the engine sampled from (its temperature, top-k, top-p), for an engine that
            records it (`VLLMEngineConfig.logprobs_mode="processed"`): the policy's and the reference's logprobs are
            then computed under it (`response_logprobs`), so the importance ratio compares like with like. None
            (default): the model's own softmax, for an engine recording raw logprobs.

    With `config.lora` the model is wrapped in a fresh LoRA adapter (`train.lora.wrap_model`, B = 0: it starts as
    the base model), `model` and `module` are then the `peft.PeftModel`, and the optimizer holds the adapter's
    parameters only (the base weights are frozen and never change). A DDP wrapper cannot be given with it.

    Raises:
        ConfigError: for a `cosine` schedule without `lr_decay_steps`; with `config.lora`, for a DDP wrapper or
            target modules that fit no layer.

    Attributes:
        learning_rate: the learning rate of 0-based optimizer step k (`train.optim.learning_rates`).
        steps_done: `train_step` calls so far.
        skipped_steps: optimizer steps skipped so far for a non-finite gradient norm.
        consecutive_skips: skips since the last optimizer step that was taken.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        config: GRPOConfig | None = None,
        reference: torch.nn.Module | None = None,
        dist: DistContext | None = None,
        sampling: SamplingDistribution | None = None,
    ) -> None:
        self.config = config or GRPOConfig()
        cfg = self.config  # the schedule is checked before the model is touched
        self.learning_rate = learning_rates(
            cfg.lr, cfg.lr_schedule, warmup=cfg.lr_warmup_steps, decay=cfg.lr_decay_steps, floor=cfg.min_lr_ratio
        )
        if self.config.lora is not None:
            if hasattr(model, "no_sync"):
                raise ConfigError(
                    "optimizer.lora cannot train a DDP wrapper: give the model itself (gradients are "
                    "averaged across ranks through `dist`)"
                )
            model = wrap_model(model, self.config.lora)
        self.model = model
        self.sampling = sampling
        self.dist = dist
        if dist is not None:
            dist.broadcast_params_(model)  # identical start on every rank
        self.pad_token_id = pad_token_id
        self.optimizer = adamw(model.parameters(), lr=self.learning_rate(0), weight_decay=self.config.weight_decay)
        if self.config.kl_coef > 0 and reference is None and self.config.lora is None:
            import copy

            reference = copy.deepcopy(self.module).eval().requires_grad_(False)
        self.reference = reference
        self.steps_done = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0

    @property
    def module(self) -> torch.nn.Module:
        """The underlying model (unwrapped from DDP)."""
        return getattr(self.model, "module", self.model)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs besides the weights: the optimizer's state and the step counters."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "steps_done": self.steps_done,
            "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (the model's weights are loaded separately).

        Raises:
            ValueError: from the optimizer, if its saved parameter groups do not fit this model's.
        """
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.steps_done = int(state["steps_done"])
        self.skipped_steps = int(state["skipped_steps"])
        self.consecutive_skips = int(state["consecutive_skips"])
        self._set_learning_rate(self.learning_rate(self.steps_done))  # the next step's, not the saved last one

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """`(name, tensor)` pairs to push into an engine (`VLLMEngine.update_weights`).

        Raises:
            TrainingError: with `config.lora` (push the adapter instead: `save_adapter`).
        """
        if self.config.lora is not None:
            raise TrainingError(
                "a LoRA trainer's weights reach an engine as an adapter: use save_adapter(folder) "
                "and the engine's update_adapter(folder)"
            )
        return [(name, p.detach()) for name, p in self.module.named_parameters()]

    def save_adapter(self, folder: str | Path) -> Path:
        """Write the LoRA adapter into `folder` as peft's `save_pretrained` does (`adapter_model.safetensors` with
        the fp32 A and B tensors, `adapter_config.json`): what `VLLMEngine.update_adapter(folder)` loads.

        Returns:
            `folder` as a `Path`.

        Raises:
            TrainingError: without `config.lora`.
            OSError: from the file system.
        """
        return save_adapter(self.module, folder)

    def train_step(
        self,
        trajectories: Sequence[Trajectory],
        *,
        group_ids: Sequence[int] | None = None,
        weight_version: int | None = None,
    ) -> dict[str, Any]:
        """One GRPO optimizer step on a rollout: every exact token run of every valid trajectory is trained.

        A trajectory whose history memory rewrote trains each of its runs, each on its own prompt, all with the
        trajectory's advantage (`pack_trajectories`, `batch_advantages`). With `advantage="step"` each turn of a
        valid trajectory is one row instead, with the advantage of its discounted return within its group and turn
        index (`step_units`, `turn_advantages`); failed, aborted and refused trajectories are left out as in
        trajectory mode, and the reward, trajectory and length metrics stay per trajectory. The step packs the
        rollout, computes the advantages, runs forward, loss and backward per micro-batch (`_accumulate_gradients`),
        clips the gradient and takes the optimizer step (`_clip_gradients`, `_optimizer_step`). If the gradient norm
        is not finite, the optimizer step is skipped (weights unchanged) and reported in `step_skipped` /
        `skipped_steps`.

        Args:
            trajectories: the rollout; rows of one task share a group (by `task["id"]`, or `group_ids`). Under
                torchrun, this rank's share: a group's advantages are its own statistics, computed on its rank, so
                each group must be whole on one rank (`distributed.shard` deals out whole tasks, each repeated
                into its group on the rank it went to).
            group_ids: explicit group of each trajectory.
            weight_version: the version of the weights this step updates; each trained token's lag is it minus the
                version that sampled the token (`lag_tokens`, `lag_logprob_gap`). None: lags are not reported.

        Returns:
            The step's `StepStats.as_metrics()`: `loss`, `pg_loss`, `kl`, the clip shares, `grad_norm`, rewards, row
            and token accounting (`tokens_sampled` == `tokens_trained` + `tokens_excluded`), `logprob_diff` (None
            when no row was computed), `step_skipped`, `skipped_steps`, `train_seconds`, the tokens and logprob gap
            by lag and the importance-weight statistics; `StepStats` documents each key.

        Raises:
            TrainingError: when `max_consecutive_skips` optimizer steps in a row were skipped (the weights no longer
                move: the model or the data produce non-finite gradients).
            TrajectoryError: from packing or the loss (inconsistent records, NaN/Inf inputs).
        """
        t0 = time.perf_counter()
        batch, outcome = self._pack(trajectories, group_ids)
        advantages = batch_advantages(batch, scale_by_std=self.config.scale_by_std, std_floor=self.config.std_floor)
        step = _StepRows.of(batch, advantages, with_kl=self._with_kl, dist=self.dist)
        sums = self._accumulate_gradients(batch, advantages, step, weight_version)
        has_grads, grad_norm = self._clip_gradients(step)
        lr = self.learning_rate(self.steps_done)
        self._set_learning_rate(lr)
        skipped = self._optimizer_step(has_grads, grad_norm)
        stats = self._step_stats(
            batch,
            step,
            sums,
            grad_norm=grad_norm,
            lr=lr,
            skipped=skipped,
            t0=t0,
            weight_version=weight_version,
            outcome=outcome,
        )
        return stats.as_metrics()

    @property
    def _with_kl(self) -> bool:
        """Whether the loss has a KL term (`kl_coef` > 0 and a reference model, or a LoRA adapter to disable)."""
        return self.config.kl_coef > 0 and (self.reference is not None or self.config.lora is not None)

    @property
    def _policy(self) -> torch.nn.Module:
        """The module whose forward computes the policy's logits: with LoRA the `transformers` model inside peft's
        wrapper (its adapter layers in place), whose forward takes `logits_to_keep` (`response_logprobs`)."""
        return adapter_model(self.model) if self.config.lora is not None else self.model

    def reference_logprobs(self, micro: PackedBatch) -> torch.Tensor:
        """The KL reference's (b, r) float32 response logprobs of `micro`, without gradient: the frozen reference
        model's, or with LoRA the policy's with its adapter disabled (the base weights, which never train)."""
        with torch.no_grad():
            if self.reference is not None or self.config.lora is None:
                return response_logprobs(self.reference, micro, distribution=self.sampling)
            with self.model.disable_adapter():
                return response_logprobs(self._policy, micro, distribution=self.sampling)

    def _pack(
        self, trajectories: Sequence[Trajectory], group_ids: Sequence[int] | None
    ) -> tuple[PackedBatch, tuple[torch.Tensor, torch.Tensor] | None]:
        """The rollout packed on the model's device, within the configured prompt and response widths: one row per
        run of each trajectory, or per step in `step` mode. In `step` mode also the valid trajectories' rewards and
        sampled-token counts ((V,) float32 each) for the metrics; None in trajectory mode (the batch has them)."""
        cfg = self.config
        device = next(self.module.parameters()).device
        widths = {
            "max_prompt_length": cfg.max_prompt_length,
            "max_response_length": cfg.max_response_length,
            "overlong_filter": cfg.overlong_filter,
        }
        if cfg.advantage == "trajectory":
            return pack_trajectories(
                trajectories, pad_token_id=self.pad_token_id, group_ids=group_ids, device=device, **widths
            ), None
        units = step_units(trajectories, group_ids=group_ids, gamma=cfg.gamma)
        batch = pack_trajectories(
            units.units, pad_token_id=self.pad_token_id, group_ids=units.group_ids, device=device, **widths
        )
        batch.trajectory_turns = torch.tensor(units.turns, dtype=torch.long, device=device)
        outcome = (torch.tensor(units.rewards, dtype=torch.float32), torch.tensor(units.lengths, dtype=torch.float32))
        return batch, outcome

    def _accumulate_gradients(
        self, batch: PackedBatch, advantages: torch.Tensor, step: _StepRows, weight_version: int | None = None
    ) -> LossSums:
        """Forward, loss and backward of each micro-batch of `step.computed`, the gradients adding up in `.grad`.

        Every micro-batch's loss is normalized by the step's global count (`_StepRows.loss_normalizer`): with N the
        response tokens (`token-mean`, DAPO) or sequences (`sequence-mean`, GRPO) of all W ranks, a micro-batch
        back-propagates (W / N) * sum of its tokens' (or its sequences' mean) losses. However the rows fall into
        micro-batches and ranks, the summed gradient averaged over ranks is that of the whole step's mean, each
        token (or sequence) weighing 1 / N; a micro-batch or rank with few tokens weighs no more per token.

        Args:
            batch: the packed rollout.
            advantages: (B,) float32 advantage of each row.
            step: the rows to train.
            weight_version: the trainer's weight version, for the logprob gap by lag (None: not measured).

        Returns:
            The micro-batches' weighted loss sums.
        """
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = LossSums()
        sequence_mask = cfg.off_policy.correction == "mask" and cfg.off_policy.mask_level == "sequence"
        chunks = _micro_batches(
            step.computed,
            batch.row_trajectory,
            cfg.micro_batch_size,
            whole_trajectories=cfg.loss_agg_mode == "sequence-mean" or sequence_mask,
        )
        normalizer = step.loss_normalizer(cfg.loss_agg_mode)
        for i, idx in enumerate(chunks):
            micro = batch.select(idx, trim=True)
            with self._gradient_sync(last=i == len(chunks) - 1):
                new, out = self._micro_loss(micro, advantages[idx], normalizer)
                out.loss.backward()
            gaps = (new.detach() - micro.old_logprobs).abs()
            lag_gap = lag_sums(gaps, micro.weight_versions, micro.response_mask, weight_version)
            weight, token_share = step.report_weights(cfg.loss_agg_mode, micro)
            sums.add(out, gaps[micro.response_mask.bool()], weight=weight, token_share=token_share, lag_gap=lag_gap)
        return sums

    def _gradient_sync(self, *, last: bool) -> AbstractContextManager[Any]:
        """A DDP wrapper's `no_sync` for every micro-batch but the last, whose backward then averages the gradients."""
        return self.model.no_sync() if (hasattr(self.model, "no_sync") and not last) else nullcontext()

    def _micro_loss(
        self, micro: PackedBatch, advantages: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, LossOutput]:
        """The policy's (b, r) float32 response logprobs of a micro-batch (with gradient) and its `grpo_loss`.

        Args:
            micro: the micro-batch's rows.
            advantages: (b,) float32 advantage of each of its rows.
            normalizer: the loss's divisor (`_StepRows.loss_normalizer`).
        """
        cfg = self.config
        new = response_logprobs(self._policy, micro, distribution=self.sampling)
        ref = self.reference_logprobs(micro) if self._with_kl else None
        out = grpo_loss(
            new,
            micro.old_logprobs,
            advantages,
            micro.response_mask,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            clip_ratio_c=cfg.clip_ratio_c,
            ref_logprobs=ref,
            kl_coef=cfg.kl_coef,
            loss_agg_mode=cfg.loss_agg_mode,
            sequence_ids=micro.row_trajectory,
            normalizer=normalizer,
            off_policy=cfg.off_policy,
        )
        return new, out

    def _clip_gradients(self, step: _StepRows) -> tuple[bool, float]:
        """Average the gradients across ranks and clip them to `max_grad_norm`.

        Args:
            step: the rows trained; if none was computed, the optimizer still steps on a zero gradient.

        Returns:
            Whether any parameter has a gradient, and the total gradient norm before clipping (0.0 without one; not
            finite when a gradient holds NaN or Inf).
        """
        if step.rows.numel() and not step.computed.numel():  # every row skipped: step on a zero gradient
            for p in self.module.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        if self.dist is not None:
            self.dist.allreduce_grads_(self.module)  # every rank joins, even with no rows of its own
        has_grads = any(p.grad is not None for p in self.module.parameters())
        grad_norm = (
            float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.config.max_grad_norm))
            if has_grads
            else 0.0
        )
        return has_grads, grad_norm

    def _set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _optimizer_step(self, has_grads: bool, grad_norm: float) -> bool:
        """Take the optimizer step, or skip it for a non-finite gradient norm; then clear the gradients. Either way
        the step counts (`steps_done`, which the learning-rate schedule follows).

        Args:
            has_grads: whether any parameter has a gradient (none: nothing to step on).
            grad_norm: the total gradient norm (global: every rank decides alike).

        Returns:
            Whether the step was skipped.

        Raises:
            TrainingError: when `max_consecutive_skips` steps in a row have now been skipped.
        """
        cfg = self.config
        skipped = has_grads and not math.isfinite(grad_norm)
        if skipped:
            self.skipped_steps += 1
            self.consecutive_skips += 1
            logger.warning(
                "non-finite gradient norm %s: optimizer step skipped (%d in a row, %d so far)",
                grad_norm,
                self.consecutive_skips,
                self.skipped_steps,
            )
        elif has_grads:
            self.optimizer.step()
            self.consecutive_skips = 0
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        if self.consecutive_skips >= cfg.max_consecutive_skips:
            raise TrainingError(
                f"{self.consecutive_skips} optimizer steps in a row were skipped for a non-finite gradient norm "
                f"(last: {grad_norm}; max_consecutive_skips={cfg.max_consecutive_skips}): the weights no longer move"
            )
        return skipped

    def _step_stats(
        self,
        batch: PackedBatch,
        step: _StepRows,
        sums: LossSums,
        *,
        grad_norm: float,
        lr: float,
        skipped: bool,
        t0: float,
        weight_version: int | None,
        outcome: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> StepStats:
        """The step's metrics; `t0` is its `time.perf_counter()` start, `weight_version` the trainer's version,
        `outcome` the valid trajectories' rewards and lengths when the batch's rows are steps (`_pack`)."""
        mask = batch.response_mask[step.rows]
        lag_tokens = lag_sums(mask, batch.weight_versions[step.rows], mask, weight_version)
        if outcome is None:
            valid_rewards = batch.trajectory_rewards[batch.trajectory_valid]
            valid_lengths = batch.trajectory_tokens[batch.trajectory_valid].float()
        else:
            valid_rewards, valid_lengths = outcome
        return StepStats(
            loss=sums.loss,
            pg_loss=sums.pg_loss,
            kl=sums.kl,
            clip_fraction=sums.clip_fraction,
            dual_clip_fraction=sums.dual_clip_fraction,
            kl_clamp_fraction=sums.kl_clamp_fraction,
            grad_norm=grad_norm,
            lr=lr,
            reward_mean=float(valid_rewards.mean()) if valid_rewards.numel() else 0.0,
            reward_std=float(valid_rewards.std(unbiased=False)) if valid_rewards.numel() else 0.0,
            valid_trajectories=int(valid_rewards.numel()),
            valid_rows=int(step.rows.numel()),
            zero_advantage_rows=int(step.rows.numel() - step.computed.numel()),
            response_length=float(valid_lengths.mean()) if valid_lengths.numel() else 0.0,
            tokens=int(step.total_tokens),
            token_counts=batch.tokens,
            logprob_diff=sums.logprob_gap / step.computed_tokens if step.computed_tokens else None,
            step_skipped=int(skipped),
            skipped_steps=self.skipped_steps,
            train_seconds=time.perf_counter() - t0,
            lag_tokens={lag: count for lag, (_, count) in lag_tokens.items()},
            lag_logprob_gap={lag: total / count for lag, (total, count) in sorted(sums.lag_gap.items())},
            is_weight_mean=sums.is_weight_sum / step.computed_tokens if step.computed_tokens else None,
            is_weight_max=sums.is_weight_max,
            is_truncated_fraction=sums.is_truncated_fraction,
            is_masked_fraction=sums.is_masked_fraction,
        )
