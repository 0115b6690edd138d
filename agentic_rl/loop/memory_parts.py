"""The parts of a per-card memory plan (`loop.memory_plan`): the trainer's and the engine's, each in GiB.

Every figure is in GiB (2**30 bytes) per card (per rank), unless it says host. A colocated run holds on each card a
trainer and a vLLM engine; the plan adds up both, phase by phase, for the trainer's settings (`GRPOConfig`: sharding,
precision, activation checkpointing, CPU offload, LoRA, micro-batch, KL) and the engine's (`EngineSection`).

Trainer (P parameters, T of them trained: all, or the LoRA adapter's; W ranks, the divisor of sharded parts):

- Weights: fp32 master copies, 4 B per parameter (the adapter's too), /W with `sharding: fsdp`.
- Gradients: 4 B per trained parameter, /W sharded; AdamW's two moments: 8 B per trained parameter, /W sharded.
  Together 16 B per trained parameter, the mixed-precision Adam figure of Rajbhandari et al. 2020, "ZeRO: Memory
  Optimizations Toward Training Trillion Parameter Models" (section 3.1), whose stage 3 is what FSDP shards.
- KL reference (`kl_coef > 0`, no LoRA): a frozen copy, 4 B per parameter, 2 B with `precision: bf16`, /W sharded.
- `precision: bf16` unsharded runs under `torch.autocast`, which keeps a bf16 copy of every linear weight it cast
  for the whole step: 2 B per linear weight (with LoRA the frozen weights' copies are saved per layer instead).
- Activations: what autograd keeps for the backward of one micro-batch of `micro_batch_size` rows of
  (prompt + response) tokens, counted tensor by tensor per decoder layer in the manner of Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models" (section 4.1), for transformers' Llama/Qwen2
  layers: RMSNorm inputs and outputs, the rotated queries, keys and values (expanded to the query heads, as the
  padded path keeps them), the attention output, the gate/up/activation/product of the gated MLP, the attention's
  log-sum-exp and, for padded rows, its mask (T columns per token: PyTorch's CPU SDPA keeps one per layer; no T x T
  scores are kept by SDPA's fused kernels). Counted with padding; rows of equal length keep ~10% less (no mask,
  keys and values at their own heads). The coefficients were checked against
  `torch.autograd.graph.saved_tensors_hooks` (`tests/loop/test_memory_plan.py`, within 2%). bf16 activations are
  half of fp32 ones but for what stays fp32 (the norms' statistics and, under autocast, the residual stream).
  Plus one layer's worth for the backward's own gradients. With activation checkpointing each layer keeps only its
  input (h values per token) and one layer is recomputed at a time (section 5 of the same paper).
- Logits: only the response columns reach the output head; per micro-batch rows x response tokens x V x
  (4 B for the fp32 log-softmax kept for the backward + the logits or their gradient in the compute dtype), and one
  row's fp32 temporaries (2 copies).
- FSDP2 (W > 1, or one rank with CPU offload): the root unit (embeddings, final norm, output head) stays gathered
  from forward to backward, two decoder layers are gathered at a time (one prefetched), in the compute dtype, and
  one layer's unsharded gradients wait for their reduce-scatter, in `reduce_dtype`.
- Replicated on W > 1 ranks: after the backward, the gradients are averaged through one flat buffer of the trained
  parameters in `reduce_dtype` (the activations are gone by then: the step's peak is the larger phase).
- `cpu_offload`: the sharded weights, gradients, AdamW state and reference live in host memory (host GiB).
- Framework overhead, a stated constant per platform (`PLATFORM_OVERHEAD_GIB`).

Engine (vLLM; with `engine.tensor_parallel_size` T, one engine per group of T consecutive ranks, its weights split
over the T cards of the group; T = 1: one whole copy per rank): weights in `engine.dtype`, /T per card (vLLM shards
the attention heads, the MLP's columns and the vocabulary of the embedding and output head; the few replicated
parts, norms and key/value projections when T exceeds the key/value heads, are not counted twice); an activation
peak for a batch of `max_num_batched_tokens` tokens, whose attention and MLP widths divide by T (the residual
stream of width h stays whole on every card, and so do the sampler's gathered logits); the KV cache,
2 x L x key/value heads per card x head_dim x dtype bytes per token, where a card holds key/value heads / T of them,
or one (replicated) when T exceeds them (vLLM needs one of the two to divide the other). Every card of the group
holds its heads for every token, so the engine holds as many tokens as one card's KV cache does. On an
accelerator vLLM takes `gpu_memory_utilization` of each card and the KV cache is what the card's weights and
activations leave of that share; on the CPU the KV cache is `kv_cache_gib` per rank. With `sleep_while_training` the engine holds nothing
on the card during the train step (weights backed up to host memory, KV cache dropped), so the step may use the
whole card; the trainer's resident part (weights, AdamW state, reference) must still leave the engine its share.

Start-up: the trainer loads the whole model in fp32 on every card before it shards it (and copies it as the KL
reference): `startup_gib`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agentic_rl.loop.model_shape import LINEAR_NAMES, ModelShape

if TYPE_CHECKING:
    from agentic_rl.train.grpo_config import GRPOConfig

__all__ = [
    "CPU_ENGINE_RUNTIME_GIB",
    "DTYPE_BYTES",
    "GIB",
    "LEVERS",
    "PLATFORM_OVERHEAD_GIB",
    "EngineMemory",
    "Levers",
    "MicroBatch",
    "TrainerMemory",
    "resolved_dtype",
    "engine_memory",
    "kv_heads_per_card",
    "layer_activation_bytes",
    "trainer_memory",
]

GIB = 2**30

#: Card memory a process holds before any tensor, in GiB: the CUDA context with cuBLAS workspaces and NCCL buffers
#: (an estimate; Hopper contexts take ~0.5 GiB with lazy module loading), the same on Ascend with HCCL's buffers
#: (an estimate), and on the CPU the baseline RSS of a process that imported torch, transformers and peft
#: (0.46 GiB measured on this project's CPU machine).
PLATFORM_OVERHEAD_GIB = {"cuda": 1.0, "npu": 1.5, "cpu": 0.5}

#: vLLM's own memory on the CPU beyond its weights, KV cache and activations, in GiB (its modules and workspaces:
#: ~2.8 GB peak RSS was measured for an in-process SmolLM2-135M engine with a 1 GiB KV cache).
CPU_ENGINE_RUNTIME_GIB = 1.5

#: The levers, in the order the plan prefers them among sets of the same size (cheapest in speed or method first).
LEVERS = ("bf16", "activation_checkpointing", "fsdp", "cpu_offload", "lora")

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_DEFAULT_LORA_RANK = 16
# Per decoder layer and token: (fp32 tensors, compute-dtype tensors) of width h kept for the backward.
_H_TENSORS = {"fp32": (6, 0), "autocast": (4, 5), "bf16": (2, 4)}


@dataclass(frozen=True, slots=True)
class Levers:
    """The trainer's memory levers (`GRPOConfig` fields), as the plan reads them.

    Attributes:
        precision: `fp32` or `bf16` (mixed precision over fp32 master weights).
        activation_checkpointing: keep each decoder layer's input only, recompute the layer in the backward.
        sharding: `replicate` or `fsdp`.
        cpu_offload: sharded weights, gradients, AdamW state and reference in host memory (needs `fsdp`).
        lora_rank: the LoRA adapter's rank r (None: full fine-tuning).
        lora_targets: the linear layers that get an adapter (names, or `all-linear`).
        lora_dropout: the adapter's input dropout (> 0 keeps a copy of each adapter's input).
        reduce_dtype: `fp32` or `bf16`, the dtype gradients are averaged across ranks in.
    """

    precision: str = "fp32"
    activation_checkpointing: bool = False
    sharding: str = "replicate"
    cpu_offload: bool = False
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | str = LINEAR_NAMES
    lora_dropout: float = 0.0
    reduce_dtype: str = "fp32"

    @classmethod
    def of(cls, optimizer: GRPOConfig) -> Levers:
        """The levers `optimizer` sets."""
        lora = optimizer.lora
        targets = lora.target_modules if lora is not None else LINEAR_NAMES
        return cls(
            precision=optimizer.precision,
            activation_checkpointing=optimizer.activation_checkpointing,
            sharding=optimizer.sharding,
            cpu_offload=optimizer.cpu_offload,
            lora_rank=lora.rank if lora is not None else None,
            lora_targets=targets if isinstance(targets, str) else tuple(targets),
            lora_dropout=lora.dropout if lora is not None else 0.0,
            reduce_dtype=optimizer.reduce_dtype,
        )

    @property
    def on(self) -> tuple[str, ...]:
        """The names (`LEVERS`) of the levers that are on, in `LEVERS` order."""
        state = {
            "bf16": self.precision == "bf16",
            "activation_checkpointing": self.activation_checkpointing,
            "fsdp": self.sharding == "fsdp",
            "cpu_offload": self.cpu_offload,
            "lora": self.lora_rank is not None,
        }
        return tuple(name for name in LEVERS if state[name])

    def with_on(self, names: tuple[str, ...] | list[str], *, only: bool = False) -> Levers:
        """These levers with `names` turned on (with `only`, every other one off); `cpu_offload` brings `fsdp`, and
        `lora` takes this rank (16 when none is set)."""
        base = replace(self, precision="fp32", activation_checkpointing=False, sharding="replicate") if only else self
        if only:
            base = replace(base, cpu_offload=False, lora_rank=None)
        updates: dict[str, Any] = {}
        if "bf16" in names:
            updates["precision"] = "bf16"
        if "activation_checkpointing" in names:
            updates["activation_checkpointing"] = True
        if "fsdp" in names or "cpu_offload" in names:
            updates["sharding"] = "fsdp"
        if "cpu_offload" in names:
            updates["cpu_offload"] = True
        if "lora" in names:
            updates["lora_rank"] = self.lora_rank or _DEFAULT_LORA_RANK
        return replace(base, **updates)


@dataclass(frozen=True, slots=True)
class TrainerMemory:
    """The trainer's memory per card in GiB, by phase; each dict maps a part to its GiB.

    Attributes:
        resident: held between steps too: weights, AdamW state, KL reference, framework overhead.
        step: held from the first forward to the optimizer step: gradients, autocast's bf16 weight copies.
        backward: the forward/backward's peak: activations, logits, FSDP's gathered units.
        after_backward: after the backward, instead of `backward`: the replicated gradient all-reduce buffer.
        host: host memory per rank: offloaded shards.
        activations_full: activations without checkpointing (GiB, for the report).
        activations_checkpointed: activations with checkpointing (GiB, for the report).
    """

    resident: dict[str, float]
    step: dict[str, float]
    backward: dict[str, float]
    after_backward: dict[str, float]
    host: dict[str, float]
    activations_full: float
    activations_checkpointed: float

    @property
    def resident_gib(self) -> float:
        """What the trainer holds on the card between steps, GiB."""
        return sum(self.resident.values())

    @property
    def peak_gib(self) -> float:
        """The trainer's peak on the card, GiB: resident + step + the larger of backward and after_backward."""
        phase = max(sum(self.backward.values()), sum(self.after_backward.values()))
        return self.resident_gib + sum(self.step.values()) + phase

    @property
    def host_gib(self) -> float:
        """Host memory per rank, GiB."""
        return sum(self.host.values())


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """The engine's memory per card (GiB) and what its KV cache holds; with tensor parallelism T > 1 every figure
    but `kv_tokens` (the whole engine's) is one card's of the engine's T.

    Attributes:
        dtype: the engine's weight and KV dtype (`bfloat16`, `float16`, `float32`).
        weights: its weights on one card, GiB (the whole model's / T).
        activations: its activation peak on one card (a batch of `max_num_batched_tokens` tokens and the
            sampler), GiB.
        kv_cache: the KV cache on one card, GiB: what the share leaves (0 when it holds no room for one).
        share: what it takes of the card while awake, GiB (`gpu_memory_utilization` x card on an accelerator).
        asleep: what it keeps on the card during the train step, GiB (0 with `sleep_while_training`, else `share`).
        host: host memory per rank, GiB (the weights backed up while it sleeps).
        kv_bytes_per_token: bytes of KV cache per token on one card (all layers, keys and values of its heads).
        kv_tokens: tokens the engine's KV cache holds, over all sequences (each card holds its heads of every
            token: one card's KV cache / `kv_bytes_per_token`).
        max_model_len: the engine window in tokens.
        n_parallel_agents: trajectories in flight per engine (`rollout.n_parallel_agents`).
        tensor_parallel_size: T, the cards one engine spreads over (`engine.tensor_parallel_size`).
    """

    dtype: str
    weights: float
    activations: float
    kv_cache: float
    share: float
    asleep: float
    host: float
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len: int
    n_parallel_agents: int
    tensor_parallel_size: int = 1

    @property
    def agents_at_max_model_len(self) -> int:
        """Sequences of `max_model_len` tokens the KV cache holds at once."""
        return self.kv_tokens // self.max_model_len

    @property
    def holds_window(self) -> bool:
        """Whether the KV cache holds one sequence of `max_model_len` tokens (vLLM refuses to start otherwise)."""
        return self.kv_tokens >= self.max_model_len

    @property
    def holds_agents(self) -> bool:
        """Whether all `n_parallel_agents` fit at `max_model_len` each (else vLLM preempts some as they grow)."""
        return self.n_parallel_agents * self.max_model_len <= self.kv_tokens


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """What the trainer's activations depend on besides the model and the levers.

    Attributes:
        rows: rows per micro-batch.
        tokens: tokens per row (prompt + response).
        response: response tokens per row (the columns that reach the output head).
        kl: whether the loss has a KL term (a frozen reference unless LoRA).
        platform: `cuda`, `npu` or `cpu` (the overhead constant).
    """

    rows: int
    tokens: int
    response: int
    kl: bool
    platform: str


def trainer_memory(shape: ModelShape, levers: Levers, gpus: int, batch: MicroBatch) -> TrainerMemory:
    """The trainer's parts (module docstring) for `levers` on `gpus` ranks."""
    sharded = levers.sharding == "fsdp" and (gpus > 1 or levers.cpu_offload)
    shards = gpus if sharded else 1
    bf16 = levers.precision == "bf16"
    lora = shape.lora_parameters(levers.lora_rank, levers.lora_targets) if levers.lora_rank else 0
    trained = lora or shape.parameters
    reference = shape.parameters * (2 if bf16 else 4) if batch.kl and not lora else 0
    held = {
        "weights": 4 * (shape.parameters + lora) / shards,
        "optimizer": 8 * trained / shards,
        "reference": reference / shards,
    }
    host = {name: held[name] / GIB for name in held} if levers.cpu_offload else {}
    resident = {name: 0.0 if levers.cpu_offload else value / GIB for name, value in held.items()}
    resident["overhead"] = PLATFORM_OVERHEAD_GIB[batch.platform]
    step = {"gradients": 0.0 if levers.cpu_offload else 4 * trained / shards / GIB}
    if levers.cpu_offload:
        host["gradients"] = 4 * trained / shards / GIB
    mode = ("bf16" if sharded else "autocast") if bf16 else "fp32"
    linear = shape.num_hidden_layers * shape.layer_linear_weights + shape.vocab_size * shape.hidden_size
    if mode == "autocast" and not lora:
        step["bf16 weight copies"] = 2 * linear / GIB  # autocast's cache, kept until the step leaves autocast
    full, checkpointed = (_activations(shape, levers, batch, mode, ckpt) for ckpt in (False, True))
    backward = {"activations": (checkpointed if levers.activation_checkpointing else full) / GIB}
    if mode == "autocast" and lora:  # frozen weights' bf16 casts, saved per layer for the backward
        layers = 1 if levers.activation_checkpointing else shape.num_hidden_layers
        backward["bf16 weight copies"] = (
            2 * (layers * shape.layer_linear_weights + shape.vocab_size * shape.hidden_size) / GIB
        )
    backward["logits"] = _logits_bytes(shape, batch, mode) / GIB
    if sharded:
        backward["fsdp gathered"] = _gathered_bytes(shape, levers, lora) / GIB
    reduce = 2 if levers.reduce_dtype == "bf16" else 4
    after = {"gradient all-reduce": trained * reduce / GIB} if not sharded and gpus > 1 else {}
    return TrainerMemory(
        resident=resident,
        step=step,
        backward=backward,
        after_backward=after,
        host=host,
        activations_full=full / GIB,
        activations_checkpointed=checkpointed / GIB,
    )


def layer_activation_bytes(shape: ModelShape, levers: Levers, mode: str, tokens: int) -> float:
    """Bytes autograd keeps per token for one decoder layer's backward, in compute `mode` (`fp32`, `autocast`:
    fp32 residual stream with bf16 matmuls, `bf16`: bf16 parameters, as under FSDP2's mixed precision)."""
    h, q, i = shape.hidden_size, shape.q_width, shape.intermediate_size
    c = 4 if mode == "fp32" else 2
    fp32_h, compute_h = _H_TENSORS[mode]
    kept = 4 * fp32_h * h + c * compute_h * h  # RMSNorm inputs/outputs (and autocast's casts of the linear inputs)
    kept += 4 * c * q  # rotated queries, keys and values expanded to the query heads, attention output
    kept += 4 * c * i  # gate, up, activation, product
    kept += 4 * shape.num_attention_heads + 8 + c * tokens  # log-sum-exp, norm statistics, a mask row
    if levers.lora_rank:
        shapes = shape.linear_shapes()
        targets = shape.lora_targets(levers.lora_targets)
        copies = (mode == "autocast") + (levers.lora_dropout > 0)  # the adapter's own cast / dropped-out input
        kept += sum(c * copies * shapes[name][0] + c * levers.lora_rank for name in targets)
    return kept


def _activations(shape: ModelShape, levers: Levers, batch: MicroBatch, mode: str, checkpointed: bool) -> float:
    """Bytes of one micro-batch's activations (logits apart), with or without activation checkpointing."""
    tokens = batch.rows * batch.tokens
    layer = layer_activation_bytes(shape, levers, mode, batch.tokens) * tokens
    c = 4 if mode == "fp32" else 2
    residual = 2 if mode == "bf16" else 4
    rest = (
        tokens * 2 * shape.hidden_size * 4 + batch.rows * batch.response * shape.hidden_size * c
    )  # final norm, head input
    if checkpointed:
        return shape.num_hidden_layers * tokens * shape.hidden_size * residual + 2 * layer + rest
    return (shape.num_hidden_layers + 1) * layer + rest


def _logits_bytes(shape: ModelShape, batch: MicroBatch, mode: str) -> float:
    """Bytes of the response columns' logits: the fp32 log-softmax kept, the logits or their gradient in the
    compute dtype, and one row's two fp32 temporaries."""
    c = 4 if mode == "fp32" else 2
    cells = batch.response * shape.vocab_size
    return batch.rows * cells * (4 + c) + 2 * cells * 4


def _gathered_bytes(shape: ModelShape, levers: Levers, lora: int) -> float:
    """Bytes FSDP2 holds unsharded: the root unit, two decoder layers, one layer's gradients before their
    reduce-scatter."""
    c = 2 if levers.precision == "bf16" else 4
    root = shape.embedding_parameters + shape.head_parameters + shape.hidden_size
    layer_grads = (lora // shape.num_hidden_layers if lora else shape.layer_parameters) * (
        2 if levers.reduce_dtype == "bf16" else 4
    )
    return c * (root + 2 * shape.layer_parameters) + layer_grads


def engine_memory(
    shape: ModelShape,
    dtype: str,
    *,
    platform: str,
    card_gib: float,
    utilization: float,
    sleep: bool,
    kv_cache_gib: float,
    max_model_len: int,
    n_parallel_agents: int,
    batched_tokens: int | None,
    max_num_seqs: int,
    tensor_parallel_size: int = 1,
) -> EngineMemory:
    """The engine's parts per card (module docstring), for an engine spread over `tensor_parallel_size` cards
    (T, which must divide the attention heads, and the key/value heads or be a multiple of them: the caller checks,
    as `memory_plan.plan_memory` does)."""
    c = DTYPE_BYTES[dtype]
    tp = tensor_parallel_size
    weights = shape.parameters * c / tp / GIB
    if batched_tokens is None:
        batched_tokens = max(max_model_len, 2048) if platform == "cpu" else (16384 if card_gib >= 70 else 8192)
    h, q, i = shape.hidden_size, shape.q_width, shape.intermediate_size
    kv = kv_heads_per_card(shape, tp) * shape.head_dim
    # one layer at a time: gate/up output and activation, queries (T-sharded), keys/values, the residual's h
    per_token = c * ((3 * i + q) / tp + 4 * h + 2 * kv)
    activations = (batched_tokens * per_token + 2 * max_num_seqs * shape.vocab_size * 4) / GIB
    if platform == "cpu":
        kv_gib = kv_cache_gib
        share = weights + activations + kv_gib + CPU_ENGINE_RUNTIME_GIB
    else:
        share = utilization * card_gib
        kv_gib = max(share - weights - activations, 0.0)
    per_token_kv = 2 * shape.num_hidden_layers * kv * c
    return EngineMemory(
        dtype=dtype,
        weights=weights,
        activations=activations,
        kv_cache=kv_gib,
        share=share,
        asleep=0.0 if sleep else share,
        host=weights if sleep else 0.0,
        kv_bytes_per_token=per_token_kv,
        kv_tokens=int(kv_gib * GIB // per_token_kv),
        max_model_len=max_model_len,
        n_parallel_agents=n_parallel_agents,
        tensor_parallel_size=tp,
    )


def kv_heads_per_card(shape: ModelShape, tensor_parallel_size: int) -> int:
    """Key/value heads one card of an engine spread over `tensor_parallel_size` (T) cards holds: key/value heads / T,
    or 1 when T exceeds them (vLLM replicates each over T / key/value heads cards)."""
    return max(shape.num_key_value_heads // tensor_parallel_size, 1)


def resolved_dtype(dtype: str, shape: ModelShape) -> str:
    """`dtype`, with `auto` read as the model's own (bfloat16 when it names none or another)."""
    if dtype == "auto":
        return shape.torch_dtype if shape.torch_dtype in DTYPE_BYTES else "bfloat16"
    return dtype
