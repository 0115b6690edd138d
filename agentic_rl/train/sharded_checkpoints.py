"""Checkpoints of a sharded trainer: every rank writes its own shards, one folder holds them all, any layout reads them.

With `optimizer.sharding: fsdp` no rank holds the whole model, so a checkpoint cannot be one `save_pretrained` folder
written by rank 0. Instead every rank calls `save_sharded_checkpoint`, in the same order:

- each rank writes the trained parameters it holds (the whole model's, or with LoRA the adapter's) and their AdamW
  state, as `torch.distributed.checkpoint` (DCP) writes a single process's (`no_dist=True`), into `shards/rank_R/`.
  The state dicts are `torch.distributed.checkpoint.state_dict.get_state_dict`'s: keyed by parameter name, frozen
  parameters left out. A `DTensor` shard carries its place in the whole tensor, so each rank's `.metadata` describes
  its chunks in the whole tensor's coordinates;
- rank 0 then merges the ranks' metadata into `shards/.metadata` (`merge_shard_metadata`): each tensor's chunks from
  every rank, a tensor every rank holds whole (AdamW's `step`) and every non-tensor entry once, each storage path
  under its rank's folder. `shards/` is then one standard DCP checkpoint, which `dcp.load(..., no_dist=True)` reads
  into any layout (the same ranks, another number of ranks, one process with plain tensors), each reader reading
  only the chunks its tensors overlap.

DCP's own coordination (`dcp.save(process_group=...)`) is not used: it maps ranks through the default process group,
which here is the colocated engine's single-rank group, not the training group (`train.distributed`).

Beside `shards/` the folder holds `training_state.pt` (the run's state; the trainer's holds no optimizer tensors:
`GRPOTrainer.state_dict`), the tokenizer, and the model's `config.json` (for `merge_checkpoint`) or, with LoRA, the
whole adapter as peft writes it (gathered on every rank, written by rank 0: what `agentic-rl merge --adapter` and
vLLM read).

It is atomic as `train.checkpoints` is: every rank writes into one temporary folder beside the final one
(`.tmp-step_K-sharded`, made afresh by rank 0 first), and once every rank wrote its shards rank 0 renames it into
place (`publish_folder`). A kill leaves the previous checkpoint intact and a `.tmp-*` folder, which `discard_partial`
removes. With several nodes the checkpoints must be on a file system that every node sees.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from agentic_rl.errors import ConfigError
from agentic_rl.train.checkpoints import STATE_FILE, CheckpointError, check_loadable, publish_folder, write_state
from agentic_rl.train.lora import ADAPTER_CONFIG, config_dtype, merge_adapter, save_adapter
from agentic_rl.train.sharding import full_adapter

if TYPE_CHECKING:
    from agentic_rl.train.distributed import DistContext
    from agentic_rl.train.trainer import GRPOTrainer

__all__ = [
    "SHARDS",
    "is_sharded_checkpoint",
    "load_sharded_checkpoint",
    "merge_checkpoint",
    "merge_shard_metadata",
    "save_sharded_checkpoint",
]

logger = logging.getLogger(__name__)

#: The DCP checkpoint's folder inside a sharded checkpoint.
SHARDS = "shards"
#: DCP's metadata file (`FileSystemWriter`'s name for it).
METADATA = ".metadata"
_MODEL, _OPTIMIZER = "model", "optimizer"


def is_sharded_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """Whether `folder` is a sharded checkpoint (its merged `shards/.metadata` exists).

    Raises:
        CheckpointError: for a `shards/` folder without its merged metadata (a copy that left the hidden file out).
    """
    shards = Path(folder) / SHARDS
    if shards.is_dir() and not (shards / METADATA).is_file():
        raise CheckpointError(
            f"{shards} holds no {METADATA}: an incomplete sharded checkpoint (copy the whole folder, hidden files "
            "included)"
        )
    return (shards / METADATA).is_file()


def _read_shards(folder: Path, load: Callable[[], None]) -> None:
    """Run `load` (a `dcp.load` from `folder`'s shards) in this process's own DCP world.

    Raises:
        CheckpointError: naming the folder, for a shard file that is missing or damaged, or tensors that do not fit.
    """
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _single_process_dcp():
            load()
    except (Exception, CheckpointException) as exc:  # DCP wraps a rank's errors in its own BaseException
        cause = str(exc).strip().splitlines()
        raise CheckpointError(
            f"the shards in {folder} cannot be read into this model (a missing or damaged shard file, or another "
            f"model's checkpoint): {cause[-1] if cause else type(exc).__name__}"
        ) from exc


def save_sharded_checkpoint(
    folder: str | os.PathLike[str], trainer: GRPOTrainer, tokenizer: Any, state: dict[str, Any]
) -> Path:
    """Write a sharded trainer's checkpoint to `folder` atomically (module docstring). Every rank of the training
    group must call it, in the same order; only rank 0's `tokenizer` and `state` are written.

    Args:
        folder: e.g. `RUN/checkpoints/step_3`; replaced if it exists.
        trainer: a sharded `GRPOTrainer` (`trainer.sharded`).
        tokenizer: the model's tokenizer.
        state: the run's training state (`torch.load(weights_only=True)`-safe: tensors, numbers, strings, lists,
            dicts), written as `training_state.pt`.

    Returns:
        `folder` as a `Path`.

    Raises:
        CheckpointError: on every rank, when any rank failed (rank 0's `state` not loadable, a shard not written,
            the metadata not merged); the rank that failed raises its own error instead.
        OSError: from the file system, on the rank that met it.
    """
    dist = trainer.dist
    folder = Path(folder)
    tmp = folder.parent / f".tmp-{folder.name}-sharded"
    try:
        _together(dist, "preparing the checkpoint", lambda: _prepare(tmp, state) if dist.is_main else None)
        adapter = full_adapter(trainer.module) if trainer.config.lora is not None else None  # gathered by all
        _together(dist, "writing its shards", lambda: _write_shards(tmp / SHARDS / f"rank_{dist.rank}", trainer))

        def publish() -> None:
            merge_shard_metadata(tmp / SHARDS, dist.world_size)
            tokenizer.save_pretrained(tmp)
            if adapter is not None:
                save_adapter(trainer.module, tmp, state_dict=adapter)
            else:
                trainer.module.config.save_pretrained(tmp)
            write_state(tmp, state)
            publish_folder(tmp, folder)

        _together(dist, "publishing the checkpoint", publish if dist.is_main else lambda: None)
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("sharded checkpoint written to %s", folder)
    return folder


def _prepare(tmp: Path, state: dict[str, Any]) -> None:
    """Rank 0, before any rank writes: check `state`, and make `tmp` empty (a killed save may have left it)."""
    check_loadable(state)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)


def _together(dist: DistContext, what: str, action: Callable[[], None]) -> None:
    """Run this rank's `action`, then wait for every rank's (a barrier): if any rank's failed, every rank raises
    (the failed one its own error), so that no rank waits for a collective that a failed rank never reaches."""
    error = None
    try:
        action()
    except Exception as exc:
        error = exc
    failed = dist.allreduce_max(1.0 if error is not None else 0.0)
    if error is not None:
        raise error
    if failed:
        raise CheckpointError(f"another rank failed while {what}: see its log")


@contextmanager
def _single_process_dcp() -> Iterator[None]:
    """Silence DCP's warning that it saves or loads as one process (`no_dist=True` says so on purpose)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _state_options(*, strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _write_shards(path: Path, trainer: GRPOTrainer) -> None:
    """This rank's trained parameters and their optimizer state into the DCP folder `path`. An optimizer that has
    not stepped yet has no state to save (asking for it would create it, with a step that changes the next one)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {_MODEL: get_model_state_dict(trainer.module, options=_state_options())}
    if trainer.optimizer.state:
        state[_OPTIMIZER] = get_optimizer_state_dict(trainer.module, trainer.optimizer, options=_state_options())
    with _single_process_dcp():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path), no_dist=True)


def load_sharded_checkpoint(folder: str | os.PathLike[str], trainer: GRPOTrainer) -> None:
    """Load a sharded checkpoint's trained parameters and optimizer state into a sharded `trainer`, each rank reading
    the chunks its shards overlap (every rank calls it). Its step counters and learning rate are the training
    state's (`GRPOTrainer.load_state_dict`, called after it).

    Raises:
        CheckpointError: when the checkpoint's tensors do not fit the trainer's (names or shapes).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    reader = dcp.FileSystemReader(Path(folder) / SHARDS)
    saved = {path[0] for path in _saved_paths(reader.read_metadata())}
    state = {_MODEL: get_model_state_dict(trainer.module, options=_state_options())}
    if _OPTIMIZER in saved:  # an optimizer that never stepped saved none: this one stays as fresh
        state[_OPTIMIZER] = get_optimizer_state_dict(trainer.module, trainer.optimizer, options=_state_options())
    _read_shards(Path(folder), lambda: dcp.load(state, storage_reader=reader, no_dist=True))
    set_model_state_dict(trainer.module, state[_MODEL], options=_state_options(strict=False))  # frozen left out
    if _OPTIMIZER in state:
        set_optimizer_state_dict(trainer.module, trainer.optimizer, state[_OPTIMIZER], options=_state_options())


def _saved_paths(metadata: Any) -> list[tuple[Any, ...]]:
    """The nested key path of every entry of a DCP checkpoint (`("model", "lm_head.weight")`)."""
    if metadata.planner_data:
        return [tuple(path) for path in metadata.planner_data.values()]
    return [tuple(fqn.split(".", 1)) for fqn in metadata.state_dict_metadata]


def merge_shard_metadata(root: str | os.PathLike[str], ranks: int) -> Any:
    """Merge the metadata of the per-rank DCP checkpoints `root/rank_0` ... `root/rank_{ranks - 1}` into
    `root/.metadata`, which makes `root` one DCP checkpoint of the whole tensors.

    Each tensor's chunks are those of every rank, except that a chunk which several ranks wrote at the same offsets
    and sizes (a tensor every rank holds whole, as AdamW's 0-d `step`) is kept once, from the lowest rank, and empty
    chunks are dropped; a non-tensor entry is kept from rank 0. Every storage path is prefixed with `rank_R/`.

    Returns:
        The merged `torch.distributed.checkpoint.metadata.Metadata`.

    Raises:
        CheckpointError: when a rank's metadata is missing (on several nodes: a checkpoint folder that not every
            node sees), the ranks hold different entries or sizes, or the chunks do not cover each tensor exactly.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    root = Path(root)
    parts = []
    for rank in range(ranks):
        try:
            parts.append(FileSystemReader(root / f"rank_{rank}").read_metadata())
        except FileNotFoundError as exc:
            raise CheckpointError(
                f"rank {rank} wrote no shards under {root} (with several nodes, checkpoints need a folder that every "
                f"node sees): {exc}"
            ) from exc
    entries: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for rank, part in enumerate(parts):
        if part.state_dict_metadata.keys() != parts[0].state_dict_metadata.keys():
            raise CheckpointError(f"ranks 0 and {rank} saved different entries under {root}")
        for fqn, entry in part.state_dict_metadata.items():
            if isinstance(entry, TensorStorageMetadata):
                _merge_chunks(fqn, entry, entries, storage, part.storage_data, rank)
            elif rank == 0:
                entries[fqn] = entry
                storage.update(_moved(part.storage_data, rank, lambda index, fqn=fqn: index.fqn == fqn))
    _check_coverage(entries)
    planner_data = parts[0].planner_data
    merged = Metadata(entries, planner_data=planner_data, storage_data=storage, version=parts[0].version)
    (root / METADATA).write_bytes(pickle.dumps(merged))
    return merged


def _merge_chunks(
    fqn: str, entry: Any, entries: dict[str, Any], storage: dict[Any, Any], rank_storage: dict[Any, Any], rank: int
) -> None:
    """Add rank `rank`'s chunks of tensor `fqn` to the merged `entries` and their places to `storage` (the index
    of each chunk its position in the merged list)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    whole = entries.setdefault(fqn, TensorStorageMetadata(entry.properties, entry.size, []))
    if whole.size != entry.size or whole.properties.dtype != entry.properties.dtype:
        raise CheckpointError(f"ranks saved {fqn} with different sizes or dtypes ({whole.size}, {entry.size})")
    for chunk in entry.chunks:
        if math.prod(chunk.sizes) == 0 and len(chunk.sizes) > 0:
            continue  # an empty shard (more ranks than rows): nothing to read
        if any(c.offsets == chunk.offsets and c.sizes == chunk.sizes for c in whole.chunks):
            continue  # held whole by every rank: once
        info = rank_storage[MetadataIndex(fqn, chunk.offsets)]
        storage[MetadataIndex(fqn, chunk.offsets, len(whole.chunks))] = _under_rank(info, rank)
        whole.chunks.append(chunk)


def _moved(rank_storage: dict[Any, Any], rank: int, keep: Callable[[Any], bool]) -> dict[Any, Any]:
    return {index: _under_rank(info, rank) for index, info in rank_storage.items() if keep(index)}


def _under_rank(info: Any, rank: int) -> Any:
    """A `FileSystemWriter` storage record whose file is under `rank_R/`.

    Raises:
        CheckpointError: for a record of another storage format.
    """
    if not dataclasses.is_dataclass(info) or not hasattr(info, "relative_path"):
        raise CheckpointError(f"unknown DCP storage record {type(info).__name__}: not a FileSystemWriter's")
    return dataclasses.replace(info, relative_path=f"rank_{rank}/{info.relative_path}")


def _check_coverage(entries: dict[str, Any]) -> None:
    """Raise `CheckpointError` unless the chunks of every tensor lie inside it and add up to its size."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    for fqn, entry in entries.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        inside = all(
            o + s <= n for chunk in entry.chunks for o, s, n in zip(chunk.offsets, chunk.sizes, entry.size, strict=True)
        )
        volume = sum(math.prod(chunk.sizes) for chunk in entry.chunks)
        if not inside or volume != math.prod(entry.size):
            raise CheckpointError(
                f"the ranks' chunks of {fqn} do not cover it exactly ({volume} of {math.prod(entry.size)} elements)"
            )


def merge_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
) -> Path:
    """Write a plain Hugging Face model folder (weights via `save_pretrained`, `config.json`, tokenizer) from a
    training checkpoint, in one process: a sharded one (its shards read whole), a replicated one (its model folder
    loaded and saved again) or a LoRA one of either kind (its adapter folded into the base: `merge_adapter`).

    Args:
        checkpoint: a checkpoint folder (`RUN/checkpoints/step_K`, `RUN/checkpoints/final`).
        out: the model folder to write (must not hold a model already).
        dtype: the saved weights' dtype; `auto`: the checkpoint's (`float32`, as trained), or with LoRA the base
            model's.

    Returns:
        `out` as a `Path`.

    Raises:
        ConfigError: when `checkpoint` is not a training checkpoint, or `out` already holds a model.
        CheckpointError: when a sharded checkpoint's shards lack a tensor of the model its `config.json` describes.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    if not checkpoint.is_dir():
        raise ConfigError(f"--checkpoint {checkpoint} does not exist (give RUN/checkpoints/final or step_K)")
    if not (checkpoint / STATE_FILE).is_file():
        raise ConfigError(
            f"--checkpoint {checkpoint} holds no {STATE_FILE}: not a training checkpoint (give "
            "RUN/checkpoints/final or RUN/checkpoints/step_K)"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a folder")
    if (out / "config.json").exists():
        raise ConfigError(f"--out {out} already holds a model (config.json): choose another folder")
    if (checkpoint / ADAPTER_CONFIG).is_file():
        return merge_adapter(checkpoint, out, dtype=dtype)
    if not (checkpoint / "config.json").is_file():
        raise CheckpointError(f"{checkpoint} holds no config.json: an incomplete checkpoint")
    config = AutoConfig.from_pretrained(str(checkpoint))
    if is_sharded_checkpoint(checkpoint):
        model = _model_from_shards(checkpoint, config)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    saved_dtype = config_dtype(config) if dtype == "auto" else getattr(torch, dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.to(saved_dtype).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(checkpoint)).save_pretrained(str(out))
    logger.info("merged %s (%s): %s", checkpoint, saved_dtype, out)
    return out


def _model_from_shards(checkpoint: Path, config: Any) -> torch.nn.Module:
    """The float32 model `config` describes, its weights read from the checkpoint's shards (built without
    initializing its weights: every one is read; its non-persistent buffers are left unset, which `save_pretrained`
    does not write).

    Raises:
        CheckpointError: when the shards lack one of its weights.
    """
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gives tied weights storages of their own: tie them again, as `config` says
    reader = dcp.FileSystemReader(checkpoint / SHARDS)
    saved = {path[1] for path in _saved_paths(reader.read_metadata()) if path[0] == _MODEL}
    weights = model.state_dict()
    missing = sorted(set(weights) - saved)
    if missing:
        raise CheckpointError(f"the shards in {checkpoint} lack {missing[:3]} ({len(missing)} weights of the model)")
    state = {_MODEL: weights}
    _read_shards(checkpoint, lambda: dcp.load(state, storage_reader=reader, no_dist=True))
    model.load_state_dict(state[_MODEL])
    return model
