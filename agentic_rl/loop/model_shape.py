"""The shape of a decoder-only model, read from its `config.json` alone (no weights): `ModelShape`.

What the memory plan (`loop.memory_plan`) needs to know of a model: its widths, depth, vocabulary, attention heads
and which layers carry biases, and from them the exact parameter count of a Llama-, Mistral-, Qwen2- or
Qwen3-shaped decoder (embeddings, output head unless tied to them, per layer the q/k/v/o projections with their
biases, the gated MLP, two RMSNorms, and the final norm). Pure arithmetic: nothing here imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = ["LINEAR_NAMES", "ModelShape"]

#: The linear layers of one decoder layer, by the module names transformers gives them (and LoRA targets).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_QKV_BIAS = frozenset({"qwen2"})  # Qwen2 (and Qwen2.5) add biases to q, k and v, never to o
_QK_NORM = frozenset({"qwen3"})  # Qwen3 normalizes queries and keys per head (two RMSNorms of head_dim)
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder's shape, as its `config.json` gives it.

    Attributes:
        name: where it was read from (a path or a registry name), for messages and reports.
        model_type: `config.json`'s `model_type` (`llama`, `qwen2`, ...; empty when absent).
        vocab_size: V, rows of the embedding and of the output head.
        hidden_size: h, the width of the residual stream.
        intermediate_size: I, the width of the gated MLP.
        num_hidden_layers: L, decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (grouped-query attention; default: the query heads).
        head_dim: width of one head (default: h / query heads).
        tie_word_embeddings: the output head shares the embedding matrix (counted once).
        qkv_bias: q, k and v projections carry biases (Qwen2, or Llama's `attention_bias`).
        o_bias: the output projection carries a bias (Llama's `attention_bias`).
        mlp_bias: the MLP projections carry biases (Llama's `mlp_bias`).
        qk_norm: a per-head RMSNorm on queries and on keys (Qwen3).
        torch_dtype: the dtype the weights were saved in (`bfloat16`, ...; None when not given).
        max_position_embeddings: the window the model was trained for, in tokens (None when not given).
    """

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    torch_dtype: str | None = None
    max_position_embeddings: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "config.json") -> ModelShape:
        """The shape a `config.json` mapping gives (a multimodal one's `text_config` is read where present).

        Raises:
            ConfigError: naming `name` and the field, for a missing field, a value that is not a positive
                integer, heads that do not divide the width or the key/value heads, or a mixture-of-experts model.
        """
        if not isinstance(config, Mapping):
            raise ConfigError(f"{name}: a config.json holds a JSON object, got {type(config).__name__}")
        text = config.get("text_config")
        merged = {**config, **text} if isinstance(text, Mapping) else dict(config)
        missing = [key for key in _REQUIRED if merged.get(key) is None]
        if missing:
            raise ConfigError(
                f"{name} lacks {', '.join(missing)}: not the config.json of a decoder-only transformer "
                "(give a model folder, its config.json, or a registry name)"
            )
        moe = [key for key in _MOE_KEYS if merged.get(key)]
        if moe:
            raise ConfigError(f"{name} is a mixture-of-experts model ({moe[0]}): the memory plan covers dense decoders")
        ints = {key: _positive(merged, key, name) for key in _REQUIRED}
        heads = ints["num_attention_heads"]
        kv_heads = _positive(merged, "num_key_value_heads", name, default=heads)
        head_dim = _positive(merged, "head_dim", name, default=None)
        if head_dim is None:
            if ints["hidden_size"] % heads:
                raise ConfigError(f"{name}: hidden_size={ints['hidden_size']} is not a multiple of {heads} heads")
            head_dim = ints["hidden_size"] // heads
        if heads % kv_heads:
            raise ConfigError(
                f"{name}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
            )
        model_type = str(merged.get("model_type") or "")
        attention_bias = bool(merged.get("attention_bias", False))
        return cls(
            name=name,
            model_type=model_type,
            **ints,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", merged.get("tie_word_embeddings", False))),
            qkv_bias=attention_bias or model_type in _QKV_BIAS,
            o_bias=attention_bias,
            mlp_bias=bool(merged.get("mlp_bias", False)),
            qk_norm=model_type in _QK_NORM,
            torch_dtype=_dtype_name(merged.get("torch_dtype", merged.get("dtype"))),
            max_position_embeddings=_positive(merged, "max_position_embeddings", name, default=None),
        )

    @classmethod
    def load(cls, source: str | os.PathLike[str]) -> ModelShape:
        """The shape of a model given as a `config.json` file, a folder holding one, or a name the model registry
        resolves (`models.resolve_model`: a registry model is built on first use; a hub id needs hub access).

        Raises:
            FileNotFoundError: for a path (a `.json` name or an existing folder) without a config.json.
            ConfigError: for a file that is not JSON or not a decoder's config (`from_config`).
            ModelError: for a name the registry does not know.
        """
        path = Path(source).expanduser()
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise FileNotFoundError(f"{path.parent} holds no config.json")
        elif not path.is_file():
            if path.suffix == ".json" or str(source).startswith((".", "/", "~")):
                raise FileNotFoundError(f"{source}: no such file or folder")
            from agentic_rl.models import resolve_model

            path = resolve_model(str(source)) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path} is not a JSON config.json: {exc}") from None
        return cls.from_config(raw, name=str(source))

    @property
    def q_width(self) -> int:
        """Width of the queries (and of the attention output): query heads x head_dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the keys, and of the values: key/value heads x head_dim."""
        return self.num_key_value_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer of one decoder layer, by module name (`LINEAR_NAMES`)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_width, self.kv_width
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_linear_weights(self) -> int:
        """Weights of one decoder layer's linear layers, biases excluded."""
        return sum(fan_in * fan_out for fan_in, fan_out in self.linear_shapes().values())

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: its linear weights and biases, two RMSNorms (and Qwen3's q/k norms)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_width, self.kv_width
        biases = (q + 2 * kv) * self.qkv_bias + h * self.o_bias + (2 * i + h) * self.mlp_bias
        norms = 2 * h + 2 * self.head_dim * self.qk_norm
        return self.layer_linear_weights + biases + norms

    @property
    def embedding_parameters(self) -> int:
        """The embedding matrix, V x h."""
        return self.vocab_size * self.hidden_size

    @property
    def head_parameters(self) -> int:
        """The output head, V x h, or 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def parameters(self) -> int:
        """Every parameter, exact for Llama-, Mistral-, Qwen2- and Qwen3-shaped decoders: embeddings, output head
        unless tied, L decoder layers, and the final RMSNorm."""
        return (
            self.embedding_parameters
            + self.head_parameters
            + self.num_hidden_layers * self.layer_parameters
            + self.hidden_size
        )

    def lora_parameters(self, rank: int, target_modules: Sequence[str] | str) -> int:
        """Parameters of a LoRA adapter of `rank` r on every decoder layer: r x (in + out) for each targeted linear
        (Hu et al. 2021, "LoRA": A is r x in, B is out x r). `target_modules` names them as peft does (a module
        whose name ends with one of them) or is `all-linear` (every linear layer but the output head).

        Raises:
            ConfigError: when no linear layer of a decoder layer matches `target_modules`.
        """
        shapes = self.linear_shapes()
        chosen = self.lora_targets(target_modules)
        if not chosen:
            raise ConfigError(f"lora.target_modules={target_modules!r} fits no linear layer of {list(shapes)}")
        return self.num_hidden_layers * sum(rank * (shapes[m][0] + shapes[m][1]) for m in chosen)

    def lora_targets(self, target_modules: Sequence[str] | str) -> list[str]:
        """The linear layers of one decoder layer that `target_modules` names (see `lora_parameters`)."""
        if isinstance(target_modules, str) and target_modules == "all-linear":
            return list(LINEAR_NAMES)
        names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        return [module for module in LINEAR_NAMES if any(module.endswith(name) for name in names)]

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of KV cache one token takes in every layer: 2 (keys and values) x L x key/value heads x head_dim x
        `dtype_bytes`."""
        return 2 * self.num_hidden_layers * self.kv_width * dtype_bytes


def _positive(config: Mapping[str, Any], key: str, name: str, default: Any = ...) -> Any:
    """`config[key]` as a positive int (`default` when absent or null, if one is given).

    Raises:
        ConfigError: naming `name` and `key`, for a value that is not a positive integer.
    """
    value = config.get(key)
    if value is None and default is not ...:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: {key}={value!r} is not a positive integer")
    return value


def _dtype_name(value: Any) -> str | None:
    """A config's `torch_dtype` as a name (`bfloat16`, `float16`, `float32`), None when absent or another kind."""
    if not isinstance(value, str):
        return None
    return value.removeprefix("torch.")
