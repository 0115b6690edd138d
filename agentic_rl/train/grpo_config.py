"""The GRPO trainer's optimizer and loss settings (`GRPOConfig`): the `optimizer` section of a training config, with
its `lora` (`LoRAConfig`), `off_policy` (`OffPolicyConfig`) and `sharding` (`Sharding`) settings. It imports no
torch, so that a config is read and checked (`agentic-rl plan`) without loading the trainer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentic_rl.config import Config

__all__ = ["DEFAULT_TARGET_MODULES", "GRPOConfig", "LoRAConfig", "OffPolicyConfig", "Sharding"]

#: The attention and MLP projections of Llama, Qwen2/3, Mistral and Gemma decoder layers (not the embedding or head).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

Sharding = Literal["replicate", "fsdp"]
"""How the ranks of a torchrun job hold the trained model: `replicate` (a whole copy on each, gradients
all-reduced) or `fsdp` (FSDP2 shards, `shard_model`)."""


class LoRAConfig(Config):
    """LoRA adapter settings (`optimizer.lora` of a training config, `lora` of an SFT config).

    Attributes:
        rank: r, the inner dimension of each adapter (A: r x in, B: out x r).
        alpha: the adapter's output is scaled by `alpha / rank`.
        dropout: dropout on the adapter's input during training (0: the adapter is deterministic).
        target_modules: names of the linear layers that get an adapter (a module whose name ends with one of them),
            or `all-linear` (every linear layer but the output head). The default covers attention and MLP.
    """

    rank: int = Field(default=16, ge=1)
    alpha: float = Field(default=32.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        default_factory=lambda: list(DEFAULT_TARGET_MODULES), min_length=1
    )


class OffPolicyConfig(Config):
    """How the policy loss corrects for tokens sampled by another policy than the trainer's (see the module).

    Raises:
        ConfigError: for `tis_cap` < 1, `mask_low` outside (0, 1) or `mask_high` <= 1.
    """

    correction: Literal["tis", "mask", "none"] = Field(
        default="tis",
        description="tis: truncate w = pi_prox / pi_behav at tis_cap; mask: weight 0 where w (token) "
        "or the sequence's geometric-mean w is outside [mask_low, mask_high]; none: plain PPO ratio pi_theta / "
        "pi_behav (no decoupling)",
    )
    tis_cap: float = Field(default=2.0, ge=1, description="upper bound of the importance weight under `tis`")
    mask_level: Literal["token", "sequence"] = Field(
        default="token",
        description="under `mask`: mask single tokens, or every token of a sequence whose "
        "geometric-mean weight is out of bounds",
    )
    mask_low: float = Field(default=0.5, gt=0, lt=1, description="lowest importance weight kept under `mask`")
    mask_high: float = Field(default=2.0, gt=1, description="highest importance weight kept under `mask`")


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
        track_kl: with `kl_coef` 0, still keep the reference and report the k3 KL to it (the metrics row's `kl`:
            how far the policy moved from where it started), at the cost of a reference forward per micro-batch
            (and the reference's memory without LoRA); it never enters the loss.
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
        sharding: how the ranks of a torchrun job hold the model: `replicate` (default: a whole copy each, gradients
            all-reduced) or `fsdp` (FSDP2: each rank holds 1/W of every parameter, gradient and optimizer moment, and
            of the frozen KL reference; `train.sharding`). One process trains alike either way.
        precision: `fp32` (default) or `bf16`: mixed precision, bf16 compute with fp32 master weights, gradients and
            AdamW state (FSDP2's `MixedPrecisionPolicy` when sharded, `torch.autocast` otherwise); the frozen KL
            reference is then kept in bf16 (`train.levers`).
        reduce_dtype: the dtype gradients are averaged across ranks in, `fp32` (default) or `bf16` (half the
            bytes on the wire, less exact); one process has nothing to reduce.
        activation_checkpointing: keep only each decoder layer's input during the forward and recompute the layer in
            the backward (about a third more compute, activations of one layer instead of all); the shared-prefix
            cache is then off, rows run whole (`train.levers`).
        cpu_offload: keep the parameter, gradient and optimizer shards in host memory, the optimizer stepping there
            (FSDP2's `CPUOffloadPolicy`); needs `sharding: fsdp` under torchrun (one rank works too).
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
    track_kl: bool = False
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
    sharding: Sharding = "replicate"
    precision: Literal["fp32", "bf16"] = "fp32"
    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    lora: LoRAConfig | None = None

    @property
    def measures_kl(self) -> bool:
        """Whether training measures the KL to its start: a KL term in the loss (`kl_coef` > 0) or `track_kl`."""
        return self.kl_coef > 0 or self.track_kl

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

    @model_validator(mode="after")
    def _offload_is_sharded(self) -> GRPOConfig:
        if self.cpu_offload and self.sharding != "fsdp":
            raise ValueError(
                "cpu_offload keeps FSDP2 shards in host memory: set sharding: fsdp (under torchrun; one rank works "
                "too), or remove cpu_offload"
            )
        return self
