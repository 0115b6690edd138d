"""LoRA training: low-rank adapters on a frozen base model, saved, restored and merged with peft.

A LoRA layer adds `(alpha / rank) * B @ A` to a frozen linear weight W (Hu et al., "LoRA: Low-Rank Adaptation of
Large Language Models", 2021): A is (rank, in) and B is (out, rank); peft initializes B to zero, so a freshly
wrapped model computes exactly what its base model does. Only A and B are trained, which shrinks the optimizer
state (AdamW keeps two fp32 moments per trained parameter) and the weight sync (the adapter, not the model).

The adapter is written as peft writes it (`adapter_model.safetensors` + `adapter_config.json`), the folder vLLM loads
as a `LoRARequest`; `merge_adapter` folds it into a plain Hugging Face model folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

import torch

from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.train.grpo_config import DEFAULT_TARGET_MODULES, LoRAConfig

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "DEFAULT_TARGET_MODULES",
    "LoRAConfig",
    "adapter_model",
    "config_dtype",
    "is_lora",
    "load_adapter",
    "merge_adapter",
    "save_adapter",
    "wrap_model",
]

logger = logging.getLogger(__name__)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def wrap_model(model: torch.nn.Module, config: LoRAConfig) -> Any:
    """`model` with a fresh LoRA adapter (B = 0) on `config.target_modules`; every base weight frozen.

    Returns:
        A `peft.PeftModel`; its base weights are `model`'s own tensors (wrapped in place, not copied).

    Raises:
        ConfigError: when no module of `model` matches `target_modules` (naming them).
    """
    from peft import LoraConfig, get_peft_model

    targets = config.target_modules if isinstance(config.target_modules, str) else list(config.target_modules)
    lora = LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as exc:
        raise ConfigError(
            f"lora.target_modules={config.target_modules!r} fits no layer of {type(model).__name__}: {exc}"
        ) from exc


def is_lora(model: Any) -> bool:
    """Whether `model` is a peft model holding a LoRA adapter (`wrap_model`)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_model(model: Any) -> torch.nn.Module:
    """The `transformers` model inside a peft model, its LoRA layers in place: its forward runs base + adapter (or
    the base alone under `model.disable_adapter()`) and takes every argument of the causal LM's own forward
    (`logits_to_keep`, `past_key_values`), which peft's wrapper does not name."""
    return model.get_base_model()


def _require_lora(model: Any, what: str) -> None:
    if not is_lora(model):
        raise TrainingError(
            f"{what} needs a LoRA model (optimizer.lora / lora in the config), got {type(model).__name__}"
        )


def save_adapter(
    model: Any, folder: str | os.PathLike[str], *, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write `model`'s adapter into `folder` as peft's `save_pretrained` does: `adapter_model.safetensors` (the A and
    B tensors, in the model's dtype) and `adapter_config.json` (rank, alpha, target modules, base model path).

    `state_dict`: the whole adapter tensors under `model.state_dict()`'s names, for a model whose own are shards
    (`GRPOTrainer.save_adapter` gathers them); None: the model's own.

    Returns:
        `folder` as a `Path`.

    Raises:
        TrainingError: if `model` has no LoRA adapter.
        OSError: from the file system.
    """
    _require_lora(model, "save_adapter")
    folder = Path(folder)
    model.save_pretrained(str(folder), state_dict=state_dict)
    return folder


def load_adapter(model: Any, folder: str | os.PathLike[str]) -> None:
    """Load the adapter weights a checkpoint or `save_adapter` wrote in `folder` into `model`'s adapter (in place,
    on its device): exactly the saved tensors.

    Raises:
        TrainingError: if `model` has no LoRA adapter, or the saved tensors do not fit its adapter (other rank or
            target modules): naming the first mismatched ones.
        FileNotFoundError: if `folder` holds no `adapter_model.safetensors`.
    """
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    _require_lora(model, "load_adapter")
    if not (Path(folder) / ADAPTER_WEIGHTS).is_file():
        raise FileNotFoundError(f"{folder} holds no {ADAPTER_WEIGHTS}")
    device = next(model.parameters()).device
    weights = load_peft_weights(str(folder), device=str(device))
    ours = {name for name, _ in model.named_parameters() if "lora_" in name}
    try:
        result = set_peft_model_state_dict(model, weights)
    except RuntimeError as exc:  # shapes that do not fit (another rank)
        raise TrainingError(f"the adapter in {folder} does not fit this model's: {exc}") from exc
    missing = sorted(name for name in result.missing_keys if name in ours)
    if result.unexpected_keys or missing:
        raise TrainingError(
            f"the adapter in {folder} does not fit this model's: missing {missing[:3]}, "
            f"unexpected {sorted(result.unexpected_keys)[:3]}"
        )


def merge_adapter(
    adapter: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    base: str | None = None,
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
) -> Path:
    """Fold an adapter into its base model and write a plain Hugging Face model folder (peft's `merge_and_unload`:
    W + (alpha / rank) * B @ A for every adapted layer), loadable by `transformers` and vLLM.

    The merge is computed in float32; the weights are then saved in `dtype` (`auto`: the base model's own dtype).
    The tokenizer is copied from `adapter` when it holds one (a training checkpoint does), else from the base.

    Args:
        adapter: a folder with `adapter_config.json` and `adapter_model.safetensors` (`save_adapter`, a LoRA
            training checkpoint, an SFT run's `adapter/`).
        out: the model folder to write (must not hold a model already).
        base: the base model (registry name, local folder or hub id); default: the adapter's
            `base_model_name_or_path`.
        dtype: the saved weights' dtype.

    Returns:
        `out` as a `Path`.

    Raises:
        ConfigError: when `adapter` is not an adapter folder, or `out` already holds a model.
        ModelError: from `resolve_model`, for an unknown base.
    """
    import json

    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.models import resolve_model

    adapter, out = Path(adapter), Path(out)
    if not (adapter / ADAPTER_CONFIG).is_file() or not (adapter / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"--adapter {adapter} holds no {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}: not a LoRA adapter")
    if (out / "config.json").exists():
        raise ConfigError(f"--out {out} already holds a model (config.json): choose another folder")
    base = base or json.loads((adapter / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{adapter / ADAPTER_CONFIG} names no base model: pass --base")
    base_dir = resolve_model(base)
    saved_dtype = config_dtype(AutoConfig.from_pretrained(str(base_dir))) if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().to(saved_dtype)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out))
    has_tokenizer = any((adapter / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    AutoTokenizer.from_pretrained(str(adapter if has_tokenizer else base_dir)).save_pretrained(str(out))
    logger.info("merged %s into %s (%s): %s", adapter, base_dir, saved_dtype, out)
    return out


def config_dtype(config: Any) -> torch.dtype:
    """The dtype a model's `config.json` asks for (float32 when it names none)."""
    wanted = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(wanted, str):
        wanted = getattr(torch, wanted, None)
    return wanted if isinstance(wanted, torch.dtype) else torch.float32
