"""Will a model train here? A per-card memory plan computed from the model's `config.json` alone: `plan_memory`.

Every figure is in GiB (2**30 bytes) per card (per rank) unless it says host. A colocated run holds on each card a
trainer and a vLLM engine; `loop.memory_parts` computes each one's parts (its docstring gives the formulas and their
sources); the plan sets them against the card, phase by phase, and tries every set of the trainer's levers
(`LEVERS`: bf16 precision, activation checkpointing, FSDP, CPU offload, LoRA) to say which make it fit.

The engine's tensor parallelism T (`engine.tensor_parallel_size`: groups of T consecutive ranks run one vLLM
engine, its weights split over their cards) divides the engine's weights and most of its activations per card; its
share of a card stays `gpu_memory_utilization` x the card, so a larger T leaves a larger KV cache on each card, and
the engine holds as many tokens as one card's KV cache does. The plan refuses a T that does not divide the ranks or
the model's attention heads (vLLM refuses those), and says the smallest T that holds every agent's whole window
(`MemoryPlan.recommended_tensor_parallel_size`). Pure arithmetic: nothing here imports torch, so a 70B config is
planned on a laptop in milliseconds.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentic_rl.errors import ConfigError
from agentic_rl.loop.memory_parts import (
    DTYPE_BYTES,
    GIB,
    LEVERS,
    PLATFORM_OVERHEAD_GIB,
    EngineMemory,
    Levers,
    MicroBatch,
    TrainerMemory,
    engine_memory,
    resolved_dtype,
    trainer_memory,
)
from agentic_rl.loop.model_shape import ModelShape

if TYPE_CHECKING:
    from agentic_rl.loop.config import TrainConfig
    from agentic_rl.train.grpo_config import GRPOConfig

__all__ = [
    "LeverOption",
    "MemoryPlan",
    "ModelShape",
    "measured_line",
    "plan_for_config",
    "plan_memory",
    "run_memory_plan",
    "tensor_parallel_refusal",
    "tensor_parallel_sizes",
]


@dataclass(frozen=True, slots=True)
class LeverOption:
    """One set of levers and what it gives.

    Attributes:
        levers: the names of the levers on (`LEVERS`).
        trainer_gib: the trainer's peak per card, GiB.
        resident_gib: the trainer's resident part per card, GiB.
        fits: whether the trainer fits its budget with them.
    """

    levers: tuple[str, ...]
    trainer_gib: float
    resident_gib: float
    fits: bool


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """A per-card memory plan (`plan_memory`); GiB per card unless named host.

    Attributes:
        model: where the shape was read from.
        parameters: the model's parameters.
        trained_parameters: parameters with gradients and AdamW state (the adapter's with LoRA).
        platform: `cuda`, `npu` or `cpu`.
        gpus: ranks (cards) the run spreads over.
        gpu_memory_gib: memory of one card, GiB (on the CPU: the host memory one rank may use).
        levers: the trainer's levers.
        rows: rows per micro-batch.
        tokens_per_row: prompt + response tokens of a row.
        response_tokens: response tokens of a row (the columns reaching the output head).
        trainer: the trainer's parts.
        engine: the engine's parts per card, at the configured tensor parallelism (`engine.tensor_parallel_size`).
        trainer_budget_gib: what the train step may use: the card less what the engine holds during it.
        resident_budget_gib: what the trainer may hold while the engine is awake: the card less the engine's share.
        startup_gib: the trainer's start-up peak (the whole fp32 model, and its KL copy, before sharding).
        options: every set of levers (`cpu_offload` only with `fsdp`) with its trainer peak and fit.
        tensor_parallel_options: the engine's parts per card at every tensor parallelism the run allows
            (`tensor_parallel_sizes`: the divisors of `gpus` vLLM accepts for the model), smallest first.
    """

    model: str
    parameters: int
    trained_parameters: int
    platform: str
    gpus: int
    gpu_memory_gib: float
    levers: Levers
    rows: int
    tokens_per_row: int
    response_tokens: int
    trainer: TrainerMemory
    engine: EngineMemory
    trainer_budget_gib: float
    resident_budget_gib: float
    startup_gib: float
    options: tuple[LeverOption, ...] = field(default=())
    tensor_parallel_options: tuple[EngineMemory, ...] = field(default=())

    @property
    def tensor_parallel_size(self) -> int:
        """T, the cards one engine spreads over (`engine.tensor_parallel_size`)."""
        return self.engine.tensor_parallel_size

    @property
    def recommended_tensor_parallel_size(self) -> int | None:
        """The smallest T that holds every agent's whole window: the smallest of `tensor_parallel_options` whose
        KV cache holds `n_parallel_agents` x `max_model_len` tokens (so vLLM never preempts an agent for room);
        None when none does (more card memory, a larger `gpu_memory_utilization`, fewer agents or a shorter
        window). A larger T leaves more KV cache per card but costs the engine an all-reduce per layer, and takes
        cards from rolling out: the smallest that holds the agents is the one to use."""
        return next((e.tensor_parallel_size for e in self.tensor_parallel_options if e.holds_agents), None)

    @property
    def trainer_fits(self) -> bool:
        return (
            self.trainer.peak_gib <= self.trainer_budget_gib and self.trainer.resident_gib <= self.resident_budget_gib
        )

    @property
    def fits(self) -> bool:
        """Whether the train step, the rollout and the engine's KV cache (one window at least) all fit."""
        return self.trainer_fits and self.engine.holds_window

    @property
    def startup_fits(self) -> bool:
        return self.startup_gib <= self.gpu_memory_gib

    @property
    def card_peak_gib(self) -> float:
        """The card's peak: the train step beside the engine's residue, or the rollout beside the resident trainer."""
        training = self.trainer.peak_gib + self.engine.asleep
        return max(training, self.trainer.resident_gib + self.engine.share)

    @property
    def host_gib(self) -> float:
        """Host memory per rank, GiB (offloaded shards, a sleeping engine's weights)."""
        return self.trainer.host_gib + self.engine.host

    @property
    def adding(self) -> tuple[str, ...]:
        """Each lever that, turned on beside the configured ones, makes the trainer fit (none when it fits)."""
        if self.trainer_fits:
            return ()
        on = set(self.levers.on)
        return tuple(
            name
            for name in LEVERS
            if name not in on and any(o.fits and set(o.levers) == on | _implied(name) for o in self.options)
        )

    @property
    def smallest_fitting(self) -> tuple[str, ...] | None:
        """The fewest levers (from none) with which the trainer fits, preferring those early in `LEVERS`; None when
        no set does."""
        return next((o.levers for o in self.options if o.fits), None)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready values (GiB rounded to 1e-6)."""
        trainer, engine = self.trainer, self.engine
        return {
            "model": self.model,
            "parameters": self.parameters,
            "trained_parameters": self.trained_parameters,
            "platform": self.platform,
            "gpus": self.gpus,
            "gpu_memory_gib": self.gpu_memory_gib,
            "tensor_parallel_size": self.tensor_parallel_size,
            "levers": list(self.levers.on),
            "micro_batch": {"rows": self.rows, "tokens_per_row": self.tokens_per_row, "response": self.response_tokens},
            "trainer": {
                **{
                    name: _rounded(getattr(trainer, name))
                    for name in ("resident", "step", "backward", "after_backward")
                },
                "host": _rounded(trainer.host),
                "activations_full_gib": round(trainer.activations_full, 6),
                "activations_checkpointed_gib": round(trainer.activations_checkpointed, 6),
                "resident_gib": round(trainer.resident_gib, 6),
                "peak_gib": round(trainer.peak_gib, 6),
                "budget_gib": round(self.trainer_budget_gib, 6),
                "resident_budget_gib": round(self.resident_budget_gib, 6),
                "fits": self.trainer_fits,
            },
            "engine": _engine_dict(engine),
            "card_peak_gib": round(self.card_peak_gib, 6),
            "host_gib_per_rank": round(self.host_gib, 6),
            "startup_gib": round(self.startup_gib, 6),
            "startup_fits": self.startup_fits,
            "fits": self.fits,
            "adding": list(self.adding),
            "smallest_fitting": None if self.smallest_fitting is None else list(self.smallest_fitting),
            "options": [
                {"levers": list(o.levers), "trainer_gib": round(o.trainer_gib, 6), "fits": o.fits} for o in self.options
            ],
            "tensor_parallel_options": [_engine_dict(e) for e in self.tensor_parallel_options],
            "recommended_tensor_parallel_size": self.recommended_tensor_parallel_size,
        }

    def tensor_parallel_advice(self) -> str | None:
        """A sentence on T when the configured one is not the recommended one (`recommended_tensor_parallel_size`),
        else None."""
        e, best = self.engine, self.recommended_tensor_parallel_size
        if best == self.tensor_parallel_size:
            return None
        window = f"every agent's whole window ({e.n_parallel_agents} x {e.max_model_len} tokens)"
        if best is None:
            sizes = ", ".join(str(o.tensor_parallel_size) for o in self.tensor_parallel_options)
            return f"no engine.tensor_parallel_size the run allows ({sizes}) holds {window}"
        chosen = next(o for o in self.tensor_parallel_options if o.tensor_parallel_size == best)
        return (
            f"engine.tensor_parallel_size={best} is the smallest that holds {window}: KV cache {chosen.kv_cache:.1f} "
            f"GiB per card, {chosen.kv_tokens} tokens"
        )

    def summary(self) -> str:
        """One line: the card's parts and the verdict (what a training run logs at its start)."""
        t, e = self.trainer, self.engine
        parts = {**t.resident, **t.step, **t.backward}
        listed = ", ".join(f"{name} {gib:.1f}" for name, gib in parts.items() if gib >= 0.05)
        verdict = "fits" if self.fits else "does NOT fit"
        advice = self.tensor_parallel_advice()
        return (
            f"memory plan per card of {self.gpu_memory_gib:g} GiB ({self.gpus} x {self.platform}, levers: "
            f"{', '.join(self.levers.on) or 'none'}): trainer {t.peak_gib:.1f} GiB at {self.rows} rows x "
            f"{self.tokens_per_row} tokens ({listed}) of {self.trainer_budget_gib:.1f}; engine at tensor parallel "
            f"{e.tensor_parallel_size}: {e.share:.1f} GiB per card (weights {e.weights:.1f}, activations "
            f"{e.activations:.1f}, KV cache it leaves {e.kv_cache:.1f}: {e.kv_tokens} KV tokens, "
            f"{e.agents_at_max_model_len} agents at {e.max_model_len}); host {self.host_gib:.1f} GiB per rank; "
            f"{verdict}" + (f"; {advice}" if advice else "")
        )


def plan_memory(
    shape: ModelShape,
    *,
    gpus: int,
    gpu_memory_gib: float,
    optimizer: GRPOConfig | Levers,
    max_prompt_length: int,
    max_response_length: int,
    n_parallel_agents: int,
    max_model_len: int,
    micro_batch_size: int | None = None,
    kl_coef: float | None = None,
    gpu_memory_utilization: float = 0.5,
    sleep_while_training: bool = False,
    engine_dtype: str = "bfloat16",
    platform: str = "cuda",
    kv_cache_gib: float = 1.0,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int = 256,
    tensor_parallel_size: int = 1,
) -> MemoryPlan:
    """The per-card memory plan of training `shape` on `gpus` cards of `gpu_memory_gib` GiB (module docstring).

    Args:
        shape: the model (`ModelShape.load`).
        gpus: ranks (cards); the sharded parts divide by it.
        gpu_memory_gib: one card's memory in GiB; on the CPU, the host memory one rank may use.
        optimizer: the trainer's settings (levers, `micro_batch_size`, `kl_coef`, which `micro_batch_size` and
            `kl_coef` override), or bare `Levers`.
        max_prompt_length / max_response_length: a training row's widths in tokens.
        n_parallel_agents / max_model_len: trajectories in flight per rank; the engine window in tokens.
        gpu_memory_utilization / sleep_while_training: the engine's share of an accelerator, in (0, 1]; whether it
            frees the card during the train step (accelerators only).
        engine_dtype: `bfloat16`, `float16`, `float32` or `auto` (the model's own dtype, else bfloat16).
        platform / kv_cache_gib: `cuda`, `npu` or `cpu` (the overhead constant); the KV cache on the CPU, GiB.
        max_num_batched_tokens / max_num_seqs: the engine's batch in tokens (None: vLLM's `LLM` default, 16384 on
            cards of 70 GiB or more, else 8192; CPU: max(window, 2048)) and in sequences (the sampler's logits).
        tensor_parallel_size: T, the cards one engine spreads over; the engine's figures are per card. Every T
            the run allows is planned too (`MemoryPlan.tensor_parallel_options`).

    Raises:
        ConfigError: for a count or size that is not positive, a utilization outside (0, 1], an unknown platform
            or dtype, or a `tensor_parallel_size` that does not divide `gpus` or the model's attention heads (or
            its key/value heads, unless it is a multiple of them).
    """
    _check_inputs(gpus, gpu_memory_gib, max_prompt_length, max_response_length, n_parallel_agents, max_model_len)
    _check_choices(platform, engine_dtype, gpu_memory_utilization, kv_cache_gib)
    if refusal := tensor_parallel_refusal(shape, gpus, tensor_parallel_size):
        raise ConfigError(refusal)
    levers = optimizer if isinstance(optimizer, Levers) else Levers.of(optimizer)
    batch = _micro_batch(optimizer, micro_batch_size, kl_coef, max_prompt_length, max_response_length, platform)

    engine_at = functools.partial(
        engine_memory, shape, resolved_dtype(engine_dtype, shape), platform=platform, card_gib=gpu_memory_gib,
        utilization=gpu_memory_utilization, sleep=sleep_while_training and platform != "cpu",
        kv_cache_gib=kv_cache_gib, max_model_len=max_model_len, n_parallel_agents=n_parallel_agents,
        batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
    )  # fmt: skip
    engine = engine_at(tensor_parallel_size=tensor_parallel_size)
    trainer_budget, resident_budget = gpu_memory_gib - engine.asleep, gpu_memory_gib - engine.share
    lora = shape.lora_parameters(levers.lora_rank, levers.lora_targets) if levers.lora_rank else 0
    return MemoryPlan(
        model=shape.name,
        parameters=shape.parameters,
        trained_parameters=lora or shape.parameters,
        platform=platform,
        gpus=gpus,
        gpu_memory_gib=gpu_memory_gib,
        levers=levers,
        rows=batch.rows,
        tokens_per_row=batch.tokens,
        response_tokens=batch.response,
        trainer=trainer_memory(shape, levers, gpus, batch),
        engine=engine,
        trainer_budget_gib=trainer_budget,
        resident_budget_gib=resident_budget,
        startup_gib=_startup_gib(shape, lora, batch),
        options=_options(shape, levers, gpus, batch, trainer_budget, resident_budget),
        tensor_parallel_options=tuple(engine_at(tensor_parallel_size=tp) for tp in tensor_parallel_sizes(shape, gpus)),
    )


def plan_for_config(
    config: TrainConfig, shape: ModelShape, *, gpus: int, gpu_memory_gib: float, platform: str = "cuda"
) -> MemoryPlan:
    """`plan_memory` for a training config: the optimizer's levers, micro-batch and KL; the row widths (the
    optimizer's packing widths, else the rollout's budgets); `rollout.n_parallel_agents`; the engine's window
    (`engine.max_model_len`, else the rollout's budget), dtype, utilization, sleep, CPU KV cache and tensor
    parallelism (`engine.tensor_parallel_size`).

    Raises:
        ConfigError: as `plan_memory`.
    """
    rollout, engine, optimizer = config.rollout, config.engine, config.optimizer
    return plan_memory(
        shape,
        gpus=gpus,
        gpu_memory_gib=gpu_memory_gib,
        optimizer=optimizer,
        max_prompt_length=optimizer.max_prompt_length or rollout.max_prompt_length,
        max_response_length=optimizer.max_response_length or rollout.max_response_length,
        n_parallel_agents=rollout.n_parallel_agents,
        max_model_len=engine.max_model_len or rollout.max_prompt_length + rollout.max_response_length,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        sleep_while_training=engine.sleep_while_training,
        engine_dtype=engine.dtype,
        platform=platform,
        kv_cache_gib=engine.kv_cache_gib,
        tensor_parallel_size=engine.tensor_parallel_size,
    )


def run_memory_plan(config: TrainConfig, model_dir: str | os.PathLike[str], world_size: int) -> MemoryPlan:
    """The plan of a training run on this machine: `plan_for_config` for the model in `model_dir` on `world_size`
    ranks of the run's device kind (`config.device`), each card as large as this rank's device
    (`ascend.device.Platform.memory_info`); on the CPU, the host memory shared by the ranks of this machine
    (`LOCAL_WORLD_SIZE`).

    Raises:
        ConfigError: for a `config.json` the plan cannot read (`ModelShape.from_config`).
        FileNotFoundError: for a `model_dir` without one.
    """
    from ascend.device import Platform

    kind = config.device.split(":")[0]
    platform = kind if kind in ("cuda", "npu") else "cpu"
    total = Platform(platform).memory_info(_local_rank())["total_bytes"] / GIB
    if platform == "cpu":
        total /= max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    shape = ModelShape.load(model_dir)
    return plan_for_config(config, shape, gpus=world_size, gpu_memory_gib=total, platform=platform)


def measured_line(plan: MemoryPlan) -> str:
    """One line: what this process measured (`Platform.peak_memory_bytes`: peak RSS on the CPU, the allocator's
    peak on an accelerator) beside the plan's card peak (the framework overhead apart on an accelerator, whose
    allocator does not count it)."""
    from ascend.device import Platform

    measured = Platform(plan.platform).peak_memory_bytes(_local_rank()) / GIB
    planned = plan.card_peak_gib - (0.0 if plan.platform == "cpu" else PLATFORM_OVERHEAD_GIB[plan.platform])
    what = "peak RSS of the process" if plan.platform == "cpu" else "peak allocated by torch"
    return (
        f"memory after the first step: measured {measured:.2f} GiB ({what}), planned {planned:.2f} GiB (trainer "
        f"{plan.trainer.peak_gib:.2f} with the engine's {plan.engine.share:.2f}, for micro-batches of {plan.rows} rows "
        f"x {plan.tokens_per_row} tokens: shorter rows take less; {measured / planned:.0%} of the plan)"
    )


def tensor_parallel_sizes(shape: ModelShape, gpus: int) -> tuple[int, ...]:
    """The engine tensor parallelisms a run of `shape` on `gpus` ranks allows, smallest first: the divisors of
    `gpus` that vLLM accepts for the model (they divide its attention heads, and its key/value heads or are a
    multiple of them)."""
    return tuple(tp for tp in range(1, int(gpus) + 1) if not tensor_parallel_refusal(shape, gpus, tp))


def tensor_parallel_refusal(shape: ModelShape, gpus: int, tp: int) -> str | None:
    """Why an engine cannot spread over `tp` cards of a run on `gpus` ranks (None when it can)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return f"tensor_parallel_size={tp!r} must be a positive integer"
    if gpus % tp:
        return (
            f"tensor_parallel_size={tp} does not divide gpus={gpus}: each group of {tp} consecutive ranks runs one "
            "engine"
        )
    heads, kv_heads = shape.num_attention_heads, shape.num_key_value_heads
    if heads % tp:
        return (
            f"tensor_parallel_size={tp} does not divide the model's num_attention_heads={heads}: vLLM splits the "
            "heads evenly over the cards"
        )
    if (kv_heads % tp) if kv_heads >= tp else (tp % kv_heads):
        return (
            f"tensor_parallel_size={tp} neither divides nor is a multiple of the model's num_key_value_heads="
            f"{kv_heads}: vLLM splits or replicates them evenly over the cards"
        )
    return None


def _engine_dict(engine: EngineMemory) -> dict[str, Any]:
    """An engine's parts as JSON-ready values (GiB rounded to 1e-6)."""
    return {
        **{k: round(getattr(engine, k), 6) for k in ("weights", "activations", "kv_cache", "share", "asleep")},
        "dtype": engine.dtype,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "host": round(engine.host, 6),
        "kv_bytes_per_token": engine.kv_bytes_per_token,
        "kv_tokens": engine.kv_tokens,
        "max_model_len": engine.max_model_len,
        "agents_at_max_model_len": engine.agents_at_max_model_len,
        "n_parallel_agents": engine.n_parallel_agents,
        "holds_window": engine.holds_window,
        "holds_agents": engine.holds_agents,
    }


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _startup_gib(shape: ModelShape, lora: int, batch: MicroBatch) -> float:
    """The trainer's start-up peak, GiB: the whole model in fp32 (with its adapter), and its fp32 copy as the KL
    reference before that is cast and sharded, beside the framework overhead."""
    copies = 2 if batch.kl and not lora else 1
    return (4 * copies * shape.parameters + 4 * lora) / GIB + PLATFORM_OVERHEAD_GIB[batch.platform]


def _micro_batch(
    optimizer: Any, rows: int | None, kl: float | None, prompt: int, response: int, platform: str
) -> MicroBatch:
    """The micro-batch `plan_memory` plans for: `rows` and `kl` where given, else the optimizer's.

    Raises:
        ConfigError: for rows below 1 or a negative KL weight.
    """
    rows = rows if rows is not None else getattr(optimizer, "micro_batch_size", 1)
    kl = kl if kl is not None else getattr(optimizer, "kl_coef", 0.0)
    if rows < 1 or kl < 0:
        raise ConfigError(f"micro_batch_size={rows} must be >= 1 and kl_coef={kl} >= 0")
    reference = kl > 0 or bool(getattr(optimizer, "track_kl", False))  # a reference measured, not in the loss
    return MicroBatch(rows, prompt + response, response, reference, platform)


def _options(
    shape: ModelShape, levers: Levers, gpus: int, batch: MicroBatch, budget: float, resident_budget: float
) -> tuple[LeverOption, ...]:
    """Every set of levers (`_lever_sets`, the configured rank and targets for LoRA) with its trainer and fit."""
    options = []
    for names in _lever_sets():
        candidate = trainer_memory(shape, levers.with_on(names, only=True), gpus, batch)
        fits = candidate.peak_gib <= budget and candidate.resident_gib <= resident_budget
        options.append(LeverOption(names, candidate.peak_gib, candidate.resident_gib, fits))
    return tuple(options)


def _lever_sets() -> list[tuple[str, ...]]:
    """Every set of levers (`cpu_offload` only with `fsdp`), fewest first, then earliest in `LEVERS`."""
    sets = [
        names
        for size in range(len(LEVERS) + 1)
        for names in itertools.combinations(LEVERS, size)
        if "cpu_offload" not in names or "fsdp" in names
    ]
    return sorted(sets, key=lambda names: (len(names), [LEVERS.index(n) for n in names]))


def _implied(name: str) -> set[str]:
    """The levers turning `name` on turns on (`cpu_offload` brings `fsdp`)."""
    return {name, "fsdp"} if name == "cpu_offload" else {name}


def _check_inputs(gpus: int, card: float, prompt: int, response: int, agents: int, window: int) -> None:
    """Raises ConfigError naming the first count or size that is not positive."""
    named = {
        "gpus": gpus,
        "gpu_memory_gib": card,
        "max_prompt_length": prompt,
        "max_response_length": response,
        "n_parallel_agents": agents,
        "max_model_len": window,
    }
    for name, value in named.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or value != value:
            raise ConfigError(f"{name}={value!r} must be a positive number")


def _check_choices(platform: str, dtype: str, utilization: float, kv_cache_gib: float) -> None:
    """Raises ConfigError for an unknown platform or dtype, a utilization outside (0, 1] or a KV cache <= 0."""
    if platform not in PLATFORM_OVERHEAD_GIB:
        raise ConfigError(f"platform={platform!r}: one of {', '.join(PLATFORM_OVERHEAD_GIB)}")
    if dtype != "auto" and dtype not in DTYPE_BYTES:
        raise ConfigError(f"engine dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)} or auto")
    if not 0 < utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization={utilization!r} must be in (0, 1]")
    if not kv_cache_gib > 0:
        raise ConfigError(f"kv_cache_gib={kv_cache_gib!r} must be positive")


def _rounded(parts: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 6) for name, value in parts.items()}
