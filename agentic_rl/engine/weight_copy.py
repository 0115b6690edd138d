"""Weight sync by copying into the running vLLM model's own weight storage (vLLM's CPU backend).

vLLM's `reload_weights` reloads a model layer by layer: it puts every layer's parameters back on the meta device,
buffers each layer's weights while counting the copied elements under a Python dispatch mode, allocates the layer
afresh, loads it, re-runs its `process_weights_after_loading` and copies the result back. On the CPU that costs
5.6-9.3x a memcpy of the same bytes (SmolLM2, bf16 / fp32; BENCHMARKS.md section 6). Here the model's own
`load_weights` (which knows how q/k/v and gate/up are fused) copies each tensor straight into the parameter that
serves it, and only the layers whose serving layout is not that parameter are re-processed:

- A linear layer whose `weight` still has its loaded shape is served from it (vLLM's plain `F.linear` fallback,
  e.g. bf16 on a CPU without AMX): the copy is all.
- A linear layer whose `weight` vLLM emptied serves from a packed copy it made after loading (a oneDNN handle,
  an AMX-packed tensor): its shards are copied into a scratch tensor of the loaded shape, built from the layout
  vLLM recorded when it built the model, and the layer's own `process_weights_after_loading` packs it again, as
  soon as all of its shards have arrived. Scratch tensors are reused between layers and syncs.
- An `lm_head` serves from a kernel built from its weight even when it keeps the weight (tied to the embedding
  or not): it is re-processed when its weight was loaded. The input embedding looks rows up in its weight: the
  copy is all.

Where any of that does not hold (not the CPU backend, more than one worker, LoRA, quantized or otherwise processed
layers, no recorded layout) `unavailable` names the reason and `load_weights`, the engine's entry point, uses
`reload_weights` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CopyStats", "ScratchPool", "copy_weights", "load_weights", "unavailable"]

ScratchPool = dict[tuple[tuple[int, ...], Any], list[Any]]
"""Free scratch tensors by (shape, dtype); owned by the engine thread."""


@dataclass(frozen=True)
class CopyStats:
    """What `copy_weights` did: tensors loaded, and layers whose packed layout was rebuilt."""

    tensors: int
    repacked: int


def _model_runner(llm: Any) -> Any:
    return llm.collective_rpc(lambda worker: worker.model_runner)[0]


def _is_packed(module: Any) -> bool:
    weight = getattr(module, "weight", None)
    return weight is not None and weight.numel() == 0


def unavailable(llm: Any) -> str | None:
    """Why `copy_weights` cannot serve this engine, or None when it can."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return f"vLLM platform {current_platform.device_type!r} is not the CPU backend"
    if current_platform.is_zen_cpu():
        return "zentorch kernels may serve from a view of the loaded weight"
    config = llm.llm_engine.vllm_config
    parallel = config.parallel_config
    if parallel.tensor_parallel_size * parallel.pipeline_parallel_size != 1:
        return "the model is split across workers"
    if config.lora_config is not None:
        return "LoRA is enabled"
    if config.model_config.quantization is not None:
        return f"the model is quantized ({config.model_config.quantization})"
    try:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
        from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs  # noqa: F401
    except ImportError as exc:
        return f"this vLLM lacks {exc.name}"
    for name, module in _model_runner(llm).model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        if type(method) not in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
            return f"{name} is processed by {type(method).__name__}"
        if isinstance(method, UnquantizedLinearMethod) and _is_packed(module):
            info = LAYERWISE_INFO.get(module)
            meta = info.restore_metadata[0].get("weight") if info is not None else None
            if meta is None or not meta.is_meta:
                return f"vLLM recorded no loaded layout for the packed layer {name}"
    return None


class _Packed:
    """Collects the shards of one packed linear layer in a scratch tensor; re-packs once all have arrived.

    A layer loaded from one tensor that already has the loaded layout (same shape and dtype, contiguous) is packed
    straight from that tensor: the packing copies it, so no scratch copy is needed.
    """

    def __init__(self, name: str, module: Any, pool: ScratchPool) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

        self.name, self.module, self.pool = name, module, pool
        self.meta = LAYERWISE_INFO[module].restore_metadata[0]["weight"]
        self.key = (tuple(self.meta.shape), self.meta.dtype)
        self.param: Any = None
        self.scratch: Any = None  # pooled storage under `param`; None while `param` borrows the caller's tensor
        self.shards: dict[Any, int] = {}

    def _over(self, data: Any) -> Any:
        """The parameter vLLM built for loading this layer (class, loader, shard layout), over `data`."""
        from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

        param = data.detach()
        param.__class__ = self.meta.__class__
        param.__dict__ = self.meta.__dict__.copy()
        restore_layer_refs(param, self.module)
        # A `reload_weights` leaves its buffering wrapper on the recorded loader; load through the layer's own one.
        loader = param.weight_loader
        while getattr(loader, "__name__", None) == "online_process_loader":
            loader = loader.__wrapped__
        param.weight_loader = loader
        return param

    @property
    def complete(self) -> bool:
        return sum(self.shards.values()) >= self.meta.numel()

    def load(self, loaded_weight: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        shard = args[0] if args else next(iter(kwargs.values()), None)
        self.shards[shard] = loaded_weight.numel()
        if self.param is None and shard is None and self.complete and loaded_weight.dtype == self.key[1]:
            if tuple(loaded_weight.shape) == self.key[0] and loaded_weight.is_contiguous():
                self.param = self._over(loaded_weight)
                return None
        if self.param is None:
            free = self.pool.get(self.key)
            self.scratch = free.pop() if free else torch.empty(self.key[0], dtype=self.key[1])
            self.param = self._over(self.scratch)
        return self.param.weight_loader(self.param, loaded_weight, *args, **kwargs)

    def repack(self) -> None:
        module = self.module
        module.weight = self.param
        module.quant_method.process_weights_after_loading(module)
        if hasattr(module, "update_param_tp_status"):
            module.update_param_tp_status()
        if module.weight is self.param:  # the kernel serves from the parameter after all: it must own its storage
            if self.scratch is None:
                module.weight.data = module.weight.data.clone()
        else:  # packed and the parameter dropped: the scratch is free again
            self.release()

    def release(self) -> None:
        if self.scratch is not None:
            self.pool.setdefault(self.key, []).append(self.scratch)
            self.scratch = None


def copy_weights(llm: Any, weights: Iterable[tuple[str, Any]], pool: ScratchPool) -> CopyStats:
    """Load `weights` (Hugging Face names) into the running model's parameters in place; see the module docstring.

    Call only where `unavailable(llm)` is None, on the thread that steps the engine.

    Raises:
        RuntimeError: a packed layer got only some of its shards (it keeps serving its previous weights).
    """
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    runner = _model_runner(llm)
    model = runner.model
    counted = 0

    def counting(items: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
        nonlocal counted
        for item in items:
            counted += 1
            yield item

    in_progress: dict[int, _Packed] = {}
    repacked = 0
    redirected: list[Any] = []

    def redirect(name: str, module: Any) -> Any:
        def loader(param: Any, loaded_weight: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal repacked
            packed = in_progress.get(id(module))
            if packed is None:
                packed = in_progress[id(module)] = _Packed(name, module, pool)
            result = packed.load(loaded_weight, *args, **kwargs)
            if packed.complete:
                del in_progress[id(module)]
                packed.repack()
                repacked += 1
            return result

        return loader

    try:
        for name, module in model.named_modules():
            if isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod) and _is_packed(module):
                module.weight.weight_loader = redirect(name, module)
                redirected.append(module.weight)
        with torch.no_grad():
            loaded = model.load_weights(counting(weights))
    finally:
        for param in redirected:
            param.__dict__.pop("weight_loader", None)
        for packed in in_progress.values():  # incomplete: the layer keeps its packed weights, the scratch is freed
            packed.release()
    if in_progress:
        names = sorted(p.name for p in in_progress.values())
        raise RuntimeError(f"only some shards of the packed layers {names} were given; they keep their old weights")

    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ids = None if loaded is None else {id(params[n]) for n in loaded if n in params}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ParallelLMHead) and (loaded_ids is None or id(module.weight) in loaded_ids):
                module.quant_method.process_weights_after_loading(module)
                repacked += 1
    for reset in ("reset_encoder_cache", "reset_mm_cache"):  # what vLLM's reload_weights also resets
        if hasattr(runner, reset):
            getattr(runner, reset)()
    return CopyStats(tensors=counted, repacked=repacked)


def load_weights(llm: Any, source: Iterator[tuple[str, Any]], pool: ScratchPool, *, reload: bool) -> str:
    """Load the `(name, tensor)` pairs of `source` into the running model, each before the next is read: by the
    in-place copy (`copy_weights`) where it is available and `reload` is False, else by vLLM's `reload_weights`. A
    tied `lm_head.weight` is skipped (vLLM derives it from the embedding). `source` is read to its end even when
    loading fails: a sharded trainer gathers each tensor as it is read, a collective of every rank.

    Call on the thread that steps the engine.

    Returns:
        Which path loaded the weights, for the log.

    Raises:
        RuntimeError / ValueError: from the load (see `copy_weights`; vLLM's own errors).
    """
    try:
        tied = getattr(llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False)
        weights = ((n, t.detach()) for n, t in source if not (tied and n.endswith("lm_head.weight")))
        why_not = "weight_sync is 'reload'" if reload else unavailable(llm)
        if why_not is None:
            stats = copy_weights(llm, weights, pool)
            return f"in-place copy of {stats.tensors} tensors, {stats.repacked} layers re-packed"
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if tied:  # vLLM leaves a tied lm_head stale after reload_weights; redo its post-load processing
            llm.apply_model(_refresh_tied_lm_head)
        return f"vLLM reload_weights (in-place copy not used: {why_not})"
    finally:
        for _ in source:
            pass


def _refresh_tied_lm_head(model: Any) -> None:
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
