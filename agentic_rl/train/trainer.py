"""GRPO trainer: packed trajectories -> one optimizer step on the training model -> weights for the engines."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from agentic_rl.errors import ConfigError, TrainingError, TrajectoryError
from agentic_rl.train.advantages import batch_advantages
from agentic_rl.train.distributed import DistContext
from agentic_rl.train.groups import TrajectoryGroup, flatten_groups
from agentic_rl.train.grpo_config import GRPOConfig
from agentic_rl.train.levers import autocast, compute_dtype, enable_activation_checkpointing, fsdp_policies
from agentic_rl.train.logprobs import SamplingDistribution
from agentic_rl.train.lora import adapter_model, save_adapter, wrap_model
from agentic_rl.train.loss import LossOutput, grpo_loss, response_logprobs
from agentic_rl.train.off_policy import lag_sums
from agentic_rl.train.optim import adamw, learning_rates, load_optimizer_state
from agentic_rl.train.packing import PackedBatch, pack_trajectories
from agentic_rl.train.sharding import full_adapter, full_weights, is_sharded, shard_model, unshard_tensor
from agentic_rl.train.step_rows import StepRows, micro_batches
from agentic_rl.train.step_stats import LossSums, StepStats
from agentic_rl.train.turn_rows import step_units
from agentic_rl.types import Trajectory

__all__ = ["GRPOConfig", "GRPOTrainer", "has_dropout"]

logger = logging.getLogger(__name__)


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a training-mode forward of `model` is stochastic: a dropout layer with p > 0 (peft's `lora_dropout`,
    GPT-2's `resid_pdrop`), or attention dropout that its config turns on (`attention_dropout`, `attn_pdrop`)."""
    nn = torch.nn
    dropouts = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    if any(isinstance(m, dropouts) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    return any(float(getattr(config, name, 0.0) or 0.0) > 0 for name in ("attention_dropout", "attn_pdrop"))


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
        stochastic: whether the model's training forward has dropout (`has_dropout`); its proximal logprobs then
            come from a forward without it (`proximal_logprobs`).
        device: where batches are packed: the model's device when given (with `cpu_offload` the shards then move
            to host memory, the compute stays there).
        sharded: whether FSDP2 holds the model (`sharding: fsdp` over a training group; one process makes a group
            of its own for `cpu_offload`, left by `close`).
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
        self._own_group: DistContext | None = None
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
        self.device = next(self.module.parameters()).device  # where batches go (offloaded shards live on the host)
        if cfg.sharding == "fsdp" and cfg.cpu_offload and (dist is None or dist.group is None):
            dist = self._own_group = DistContext.solo(self.device.type)  # FSDP2 on one rank: offload needs a mesh
        self.dist = dist
        self.sharded = cfg.sharding == "fsdp" and dist is not None and dist.group is not None
        if cfg.sharding == "fsdp" and not self.sharded:
            logger.info("optimizer.sharding 'fsdp' on one rank: nothing to shard, the model trains whole")
        if dist is not None:
            dist.broadcast_params_(model)  # identical start on every rank
        self.pad_token_id = pad_token_id
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(self.module)
        if self.config.measures_kl and reference is None and self.config.lora is None:
            import copy

            reference = copy.deepcopy(self.module).eval().requires_grad_(False)
            reference.to(compute_dtype(cfg.precision))  # frozen: no master weights to keep in fp32
        self.reference = reference
        if self.sharded:
            self._shard(reference)
        self.optimizer = adamw(model.parameters(), lr=self.learning_rate(0), weight_decay=self.config.weight_decay)
        self.stochastic = has_dropout(self.module)
        self.steps_done = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0

    def _shard(self, reference: torch.nn.Module | None) -> None:
        """Shard the policy (and an unsharded KL reference, frozen: 1/W of a model per rank, no gradients) over the
        training group, with the levers' mixed-precision and offload policies (`train.levers.fsdp_policies`).

        Raises:
            ConfigError: for a DDP wrapper.
        """
        cfg = self.config
        if hasattr(self.model, "no_sync"):
            raise ConfigError("optimizer.sharding: fsdp shards the model itself: give it unwrapped, not in DDP")
        policies = fsdp_policies(cfg.precision, cfg.reduce_dtype, cfg.cpu_offload)
        shard_model(self.module, self._policy, self.dist.mesh(), **policies)
        if reference is not None and not is_sharded(reference):
            shard_model(reference, reference, self.dist.mesh(), **policies)

    def close(self) -> None:
        """Leave the one-rank training group the trainer made for `cpu_offload` on one process (nothing to do
        otherwise, or when an engine's shutdown destroyed it already): a group still held when the interpreter
        shuts down may abort the process."""
        if self._own_group is not None:
            self._own_group.close()

    @property
    def module(self) -> torch.nn.Module:
        """The underlying model (unwrapped from DDP)."""
        return getattr(self.model, "module", self.model)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs besides the weights: the optimizer's state and the step counters. Sharded, the
        optimizer's state is None here: its tensors are shards, which a sharded checkpoint holds with the weights'
        (`train.sharded_checkpoints`)."""
        return {
            "optimizer": None if self.sharded else self.optimizer.state_dict(),
            "steps_done": self.steps_done,
            "skipped_steps": self.skipped_steps,
            "consecutive_skips": self.consecutive_skips,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (the model's weights, and a sharded trainer's optimizer state, are
        loaded separately, before it: it sets the next step's learning rate).

        Raises:
            ValueError: from the optimizer, if its saved parameter groups do not fit this model's.
        """
        if state["optimizer"] is not None:
            load_optimizer_state(self.optimizer, state["optimizer"])
        self.steps_done = int(state["steps_done"])
        self.skipped_steps = int(state["skipped_steps"])
        self.consecutive_skips = int(state["consecutive_skips"])
        self._set_learning_rate(self.learning_rate(self.steps_done))  # the next step's, not the saved last one

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, whole tensor)` pairs to push into an engine (`VLLMEngine.update_weights`), in `named_parameters`
        order. Sharded, each is gathered as it is asked for (`train.sharding.full_weights`): consume them one at a
        time and whole, on every rank.

        Raises:
            TrainingError: with `config.lora` (push the adapter instead: `save_adapter`).
        """
        if self.config.lora is not None:
            raise TrainingError(
                "a LoRA trainer's weights reach an engine as an adapter: use save_adapter(folder) "
                "and the engine's update_adapter(folder)"
            )
        return full_weights(self.module)

    def save_adapter(self, folder: str | Path) -> Path:
        """Write the LoRA adapter into `folder` as peft's `save_pretrained` does (`adapter_model.safetensors` with
        the fp32 A and B tensors, `adapter_config.json`): what `VLLMEngine.update_adapter(folder)` loads. Sharded,
        every rank must call it (the adapter's tensors are gathered).

        Returns:
            `folder` as a `Path`.

        Raises:
            TrainingError: without `config.lora`.
            OSError: from the file system.
        """
        whole = full_adapter(self.module) if self.sharded else None  # gathered in the same order on every rank
        return save_adapter(self.module, folder, state_dict=whole)

    def train_step(
        self,
        rollout: Sequence[TrajectoryGroup] | Sequence[Trajectory],
        *,
        group_ids: Sequence[int] | None = None,
        weight_version: int | None = None,
    ) -> StepStats:
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
            rollout: the rollout's task groups (`TrajectoryGroup`: what the scheduler hands a step; each group is
                one GRPO group), or its trajectories, rows of one task sharing a group (by `task["id"]`, or
                `group_ids`). Under torchrun, this rank's share: a group's advantages are its own statistics,
                computed on its rank, so each group must be whole on one rank (`distributed.shard` deals out whole
                tasks, each repeated into its group on the rank it went to).
            group_ids: explicit group of each trajectory (trajectories only: groups are their own).
            weight_version: the version of the weights this step updates; each trained token's lag is it minus the
                version that sampled the token (`lag_tokens`, `lag_logprob_gap`). None: lags are not reported.

        Returns:
            The step's `StepStats`: `loss`, `pg_loss`, `kl`, the clip shares, `grad_norm`, rewards, row and token
            accounting (`tokens_sampled` == `tokens_trained` + `tokens_excluded`), `logprob_diff` (None when no row
            was computed), `step_skipped`, `skipped_steps`, `train_seconds`, the tokens and logprob gap by lag and
            the importance-weight statistics (`StepStats.as_metrics` flattens them into one dict).

        Raises:
            TrainingError: when `max_consecutive_skips` optimizer steps in a row were skipped (the weights no longer
                move: the model or the data produce non-finite gradients).
            TrajectoryError: from packing or the loss (inconsistent records, NaN/Inf inputs); for groups given with
                `group_ids`.
        """
        t0 = time.perf_counter()
        trajectories, group_ids = _trajectories(rollout, group_ids)
        batch, outcome = self._pack(trajectories, group_ids)
        advantages = batch_advantages(batch, scale_by_std=self.config.scale_by_std, std_floor=self.config.std_floor)
        step = StepRows.of(batch, advantages, with_kl=self._with_kl, dist=self.dist)
        sums = self._accumulate_gradients(batch, advantages, step, weight_version)
        has_grads, grad_norm = self._clip_gradients(step)
        lr = self.learning_rate(self.steps_done)
        self._set_learning_rate(lr)
        skipped = self._optimizer_step(has_grads, grad_norm)
        return StepStats.of(
            batch,
            step,
            sums,
            grad_norm=grad_norm,
            lr=lr,
            skipped=skipped,
            skipped_steps=self.skipped_steps,
            t0=t0,
            weight_version=weight_version,
            outcome=outcome,
        )

    @property
    def _with_kl(self) -> bool:
        """Whether the step measures the KL to the start (`GRPOConfig.measures_kl`: a KL term in the loss, or
        `track_kl`) and has a reference for it (a model, or a LoRA adapter to disable)."""
        return self.config.measures_kl and (self.reference is not None or self.config.lora is not None)

    @property
    def _policy(self) -> torch.nn.Module:
        """The module whose forward computes the policy's logits: with LoRA the `transformers` model inside peft's
        wrapper (its adapter layers in place), whose forward takes `logits_to_keep` (`response_logprobs`)."""
        return adapter_model(self.model) if self.config.lora is not None else self.model

    def _logprobs(self, model: torch.nn.Module, micro: PackedBatch) -> torch.Tensor:
        """`response_logprobs` of `micro` under the engine's distribution, in the configured precision (sharded,
        FSDP2 casts; whole, `autocast`); sharded, in exactly one forward (no shared prefix, no length buckets: every
        rank must run as many forwards as the others, `train.sharding`); with activation checkpointing, without the
        shared prefix (a checkpointed layer takes no key/value cache, `train.levers`)."""
        whole = not self.sharded
        share = whole and not self.config.activation_checkpointing
        with nullcontext() if self.sharded else autocast(self.config.precision, self.device):
            return response_logprobs(model, micro, distribution=self.sampling, share_prefix=share, bucket=whole)

    def reference_logprobs(self, micro: PackedBatch) -> torch.Tensor:
        """The KL reference's (b, r) float32 response logprobs of `micro`, without gradient: the frozen reference
        model's, or with LoRA the policy's with its adapter disabled (the base weights, which never train)."""
        with torch.no_grad():
            if self.reference is not None or self.config.lora is None:
                return self._logprobs(self.reference, micro)
            with self.model.disable_adapter():
                return self._logprobs(self._policy, micro)

    def _pack(
        self, trajectories: Sequence[Trajectory], group_ids: Sequence[int] | None
    ) -> tuple[PackedBatch, tuple[torch.Tensor, torch.Tensor] | None]:
        """The rollout packed on the model's device, within the configured prompt and response widths: one row per
        run of each trajectory, or per step in `step` mode. In `step` mode also the valid trajectories' rewards and
        sampled-token counts ((V,) float32 each) for the metrics; None in trajectory mode (the batch has them)."""
        cfg = self.config
        device = self.device
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
        self, batch: PackedBatch, advantages: torch.Tensor, step: StepRows, weight_version: int | None = None
    ) -> LossSums:
        """Forward, loss and backward of each micro-batch of `step.computed`, the gradients adding up in `.grad`.

        Every micro-batch's loss is normalized by the step's global count (`StepRows.loss_normalizer`): with N the
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
        chunks = micro_batches(
            step.computed,
            batch.row_trajectory,
            cfg.micro_batch_size,
            whole_trajectories=cfg.loss_agg_mode == "sequence-mean" or sequence_mask,
        )
        normalizer = step.loss_normalizer(cfg.loss_agg_mode)
        if self.sharded:  # every rank runs as many forward/backward passes (collectives) as the busiest one
            for _ in range(int(self.dist.allreduce_max(len(chunks))) - len(chunks)):
                self._idle_pass()
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

    def _idle_pass(self) -> None:
        """The collectives of one micro-batch without its rows (sharded only): the forwards a micro-batch runs
        (`_micro_loss`: the proximal one with dropout, the policy's, the reference's with KL) and a backward, on one
        pad token, the loss times 0: a zero gradient, reduce-scattered like a real one."""
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        if self.stochastic:
            self.model.eval()
            with torch.no_grad():
                self._policy(input_ids=ids)
            self.model.train()
        loss = self._policy(input_ids=ids).logits.float().sum() * 0.0
        if self._with_kl:
            with torch.no_grad():
                if self.reference is not None:
                    self.reference(input_ids=ids)
                else:
                    with self.model.disable_adapter():
                        self._policy(input_ids=ids)
        loss.backward()

    def _gradient_sync(self, *, last: bool) -> AbstractContextManager[Any]:
        """A DDP wrapper's `no_sync` for every micro-batch but the last, whose backward then averages the gradients."""
        return self.model.no_sync() if (hasattr(self.model, "no_sync") and not last) else nullcontext()

    def proximal_logprobs(self, micro: PackedBatch) -> torch.Tensor | None:
        """The proximal policy's (b, r) float32 response logprobs of `micro`, when they differ from the trained
        forward's: a model with dropout (`stochastic`, e.g. LoRA `dropout` > 0) runs its training forward with
        dropout noise, which is no change of policy; pi_prox, whose ratio to the engine's logprobs makes the
        importance weights (`off_policy`), is then the model's own forward without dropout (eval mode, no gradient).
        None without dropout: pi_prox is the trained forward's logprobs, detached (`grpo_loss`)."""
        if not self.stochastic:
            return None
        self.model.eval()
        try:
            with torch.no_grad():
                return self._logprobs(self._policy, micro)
        finally:
            self.model.train()

    def _micro_loss(
        self, micro: PackedBatch, advantages: torch.Tensor, normalizer: float
    ) -> tuple[torch.Tensor, LossOutput]:
        """The policy's (b, r) float32 response logprobs of a micro-batch and its `grpo_loss`: the proximal ones
        when the model has dropout (`proximal_logprobs`), else the trained forward's (with gradient).

        Args:
            micro: the micro-batch's rows.
            advantages: (b,) float32 advantage of each of its rows.
            normalizer: the loss's divisor (`StepRows.loss_normalizer`).
        """
        cfg = self.config
        proximal = self.proximal_logprobs(micro)
        new = self._logprobs(self._policy, micro)
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
            proximal_logprobs=proximal,
        )
        return (new if proximal is None else proximal), out

    def _clip_gradients(self, step: StepRows) -> tuple[bool, float]:
        """Average the gradients across ranks and clip them to `max_grad_norm`.

        Args:
            step: the rows trained; if none was computed, the optimizer still steps on a zero gradient.

        Returns:
            Whether any parameter has a gradient, and the total gradient norm before clipping (0.0 without one; not
            finite when a gradient holds NaN or Inf).
        """
        if step.rows.numel() and not step.computed.numel():  # every row skipped: step on a zero gradient
            for p in self.module.parameters():
                if p.requires_grad and p.grad is None:  # sharded, idle passes left this rank's share of the others'
                    p.grad = torch.zeros_like(p)
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.sharded:  # FSDP2 reduce-scattered them; the norm is a collective: every rank decides alike
            has_grads = self.dist.allreduce_max(float(any(p.grad is not None for p in params))) > 0
            for p in params if has_grads else ():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        else:
            if self.dist is not None:  # every rank joins, even with no rows of its own
                self.dist.allreduce_grads_(self.module, dtype=compute_dtype(self.config.reduce_dtype))
            has_grads = any(p.grad is not None for p in params)
        if not has_grads:
            return False, 0.0
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        return True, float(unshard_tensor(norm))

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


def _trajectories(
    rollout: Sequence[TrajectoryGroup] | Sequence[Trajectory], group_ids: Sequence[int] | None
) -> tuple[Sequence[Trajectory], Sequence[int] | None]:
    """The trajectories of `train_step`'s rollout and their groups: groups flattened (`flatten_groups`), or the
    trajectories as given with `group_ids`.

    Raises:
        TrajectoryError: for groups given with `group_ids`, or a rollout that mixes groups and trajectories.
    """
    groups = [g for g in rollout if isinstance(g, TrajectoryGroup)]
    if not groups:
        return rollout, group_ids  # type: ignore[return-value]
    if group_ids is not None or len(groups) != len(rollout):
        raise TrajectoryError("train_step takes task groups or trajectories (with group_ids), not both")
    return flatten_groups(groups)
