"""Training checkpoints that a kill cannot leave half-written, and the state a resumed run continues from.

A checkpoint is a folder (`checkpoints/step_K/`, `checkpoints/final/`) holding the model and tokenizer
(`save_pretrained`) and `training_state.pt` (what the caller needs to continue: step, optimizer, RNG states...). It
is written into a temporary folder beside its final place (`.tmp-step_K-*`), every file and the folder are fsynced,
and the folder is then renamed into place, so a checkpoint folder either is complete or does not exist: a process
killed while saving leaves only a temporary folder, which `discard_partial` removes, and the previous checkpoint
intact. Old step checkpoints are removed by renaming them aside first (`.trash-*`), so a kill during removal never
leaves a half-deleted folder under a checkpoint's name.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentic_rl.errors import TrainingError

__all__ = [
    "FINAL",
    "STATE_FILE",
    "Checkpoint",
    "CheckpointError",
    "capture_rng_state",
    "check_loadable",
    "discard_partial",
    "latest_checkpoint",
    "load_state",
    "prune_checkpoints",
    "publish_folder",
    "restore_rng_state",
    "save_checkpoint",
    "weights_digest",
    "write_atomically",
    "write_state",
]

logger = logging.getLogger(__name__)

STATE_FILE = "training_state.pt"
FINAL = "final"
_STEP = re.compile(r"step_(\d+)")
_PARTIAL = (".tmp-", ".trash-")


class CheckpointError(TrainingError):
    """A training state a checkpoint cannot hold (it would not load with `torch.load(weights_only=True)`)."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint folder and the step it was taken after (`final`: the run's last step)."""

    path: Path
    step: int


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(folder: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Make `folder` appear complete or not at all: `write(tmp)` fills a temporary folder beside it, which is
    fsynced (files, then the folder) and renamed to `folder`. An existing `folder` is replaced.

    Returns:
        `folder` as a `Path`.

    Raises:
        Whatever `write` raises (the temporary folder is removed first) and `OSError` from the file system.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    try:
        write(tmp)
        publish_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def publish_folder(tmp: Path, folder: Path) -> None:
    """Put the filled temporary folder `tmp` (beside `folder`, named `.tmp-*`) in place as `folder`: its modes as the
    umask allows, every file and then the folder fsynced, an existing `folder` removed (`prune_checkpoints`' way:
    renamed aside first), `tmp` renamed to `folder` and the parent fsynced. A kill at any point leaves either the
    old `folder` or the new one, and at most a `.tmp-*` / `.trash-*` folder (`discard_partial`).

    Raises:
        OSError: from the file system (`tmp` is left for the caller to remove).
    """
    _permissions_as_umask_allows(tmp)
    for root, _dirs, files in os.walk(tmp):
        for name in files:
            _fsync(Path(root) / name)
    _fsync(tmp)
    if folder.exists():  # no atomic swap of two folders: move the old one aside, then drop it
        _remove(folder)
    os.replace(tmp, folder)
    _fsync(folder.parent)


def _permissions_as_umask_allows(tmp: Path) -> None:
    """Give the folder and its files the modes a plain `mkdir` / `open` would (mkdtemp makes the folder 0700, and
    writers that go through a temporary file leave it 0600), so that a shared run folder stays readable."""
    umask = _umask()
    if umask is None:  # unknown: keep the modes as they are rather than guess looser ones
        return
    tmp.chmod(0o777 & ~umask)
    for root, dirs, files in os.walk(tmp):
        for name, mode in [(d, 0o777) for d in dirs] + [(f, 0o666) for f in files]:
            path = Path(root) / name
            if not path.is_symlink():  # a link's target may lie outside the folder
                path.chmod(mode & ~umask)


def _umask() -> int | None:
    """The process's umask, read without changing it (`os.umask` sets it, for every thread, while it reads); None
    where the system does not show it (Linux does, in /proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


def _remove(folder: Path) -> None:
    trash = Path(tempfile.mkdtemp(prefix=f".trash-{folder.name}-", dir=folder.parent))
    os.replace(folder, trash / folder.name)
    _fsync(folder.parent)
    shutil.rmtree(trash)


def save_checkpoint(folder: str | os.PathLike[str], model: Any, tokenizer: Any, state: dict[str, Any]) -> Path:
    """Write `model` and `tokenizer` (`save_pretrained`) and `state` (`torch.save` into `STATE_FILE`) to `folder`
    atomically (see `write_atomically`).

    Args:
        folder: e.g. `RUN/checkpoints/step_3`.
        model: a `transformers` model.
        tokenizer: its tokenizer.
        state: tensors, numbers, strings, lists and dicts (loadable with `torch.load(weights_only=True)`).

    Raises:
        CheckpointError: for a `state` that `torch.load(weights_only=True)` could not read back (checked before
            anything is written, and once more on the file written: nothing is left under `folder` then).
        OSError: from the file system.
    """

    check_loadable(state)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_state(tmp, state)

    path = write_atomically(folder, write)
    logger.info("checkpoint written to %s", path)
    return path


#: The leaf types a training state may hold (`check_loadable`), besides tensors: what
#: `torch.load(weights_only=True)` reads back (exactly these types: a NumPy scalar or an enum is refused).
_LEAVES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
_CONTAINERS = (dict, OrderedDict, list, tuple)


def check_loadable(state: Any, where: str = "state") -> None:
    """Check that `state` holds nothing but what `torch.load(weights_only=True)` reads back: dicts, lists and
    tuples of tensors, numbers, strings, bytes and None (no datetime, Decimal, NumPy scalar or other object).

    Raises:
        CheckpointError: naming the first value that is not, by its path (`state['history'][3]['when']`).
    """
    if isinstance(state, torch.Tensor) or type(state) in _LEAVES:
        return
    if type(state) not in _CONTAINERS:
        raise CheckpointError(
            f"{where} is a {type(state).__module__}.{type(state).__qualname__} ({state!r:.80}), which a checkpoint "
            f"cannot hold (torch.load(weights_only=True) would refuse it): store plain numbers, strings, lists, "
            f"dicts or tensors"
        )
    if isinstance(state, dict):
        for key, value in state.items():
            check_loadable(key, f"a key of {where}")
            check_loadable(value, f"{where}[{key!r}]")
    else:
        for i, value in enumerate(state):
            check_loadable(value, f"{where}[{i}]")


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """`torch.save(state)` into `folder / STATE_FILE`, then read it back as a resumed run will.

    Raises:
        CheckpointError: when the file written cannot be read back with `torch.load(weights_only=True)`.
    """
    torch.save(state, folder / STATE_FILE)
    _load_back(folder / STATE_FILE)


def _load_back(path: Path) -> None:
    """Read a state file just written as a resumed run will (`torch.load(weights_only=True)`, tensors mapped, not
    read).

    Raises:
        CheckpointError: when it cannot.
    """
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise CheckpointError(f"the training state written to {path.name} cannot be read back: {exc}") from exc


def load_state(checkpoint: Checkpoint | str | os.PathLike[str]) -> dict[str, Any]:
    """The `state` a checkpoint was saved with (`torch.load(weights_only=True)`, on the CPU).

    Raises:
        FileNotFoundError: if the folder has no `STATE_FILE`.
    """
    folder = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    found = []
    for path in root.iterdir() if root.is_dir() else ():
        match = _STEP.fullmatch(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike[str], final_step: int) -> Checkpoint | None:
    """The newest complete checkpoint under `root`: `final` (at `final_step`) if present, else the `step_K` with
    the highest K. Folders without `STATE_FILE` (written before training states existed) and partial
    `.tmp-*` / `.trash-*` folders are not checkpoints.

    Returns:
        None when there is none.
    """
    root = Path(root)
    if (root / FINAL / STATE_FILE).is_file():
        return Checkpoint(root / FINAL, final_step)
    steps = _step_folders(root)
    return Checkpoint(steps[-1][1], steps[-1][0]) if steps else None


def discard_partial(root: str | os.PathLike[str]) -> list[Path]:
    """Remove what a kill during a save or a removal left under `root` (`.tmp-*` and `.trash-*` folders).

    Returns:
        The folders removed.
    """
    root = Path(root)
    removed = [p for p in (root.iterdir() if root.is_dir() else ()) if p.name.startswith(_PARTIAL)]
    for path in removed:
        logger.warning("removing %s, left by a process killed while saving or removing a checkpoint", path)
        shutil.rmtree(path)
    return removed


def prune_checkpoints(root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Remove all but the newest `keep` `step_K` checkpoints under `root` (0: keep all; `final` is never removed).

    Returns:
        The folders removed.
    """
    steps = _step_folders(Path(root))
    doomed = [path for _, path in steps[: max(len(steps) - keep, 0)]] if keep > 0 else []
    for path in doomed:
        _remove(path)
    return doomed


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's `random`, NumPy's global generator (if NumPy is installed), torch's CPU generator
    and, when CUDA is available, every CUDA device's generator, as `torch.load(weights_only=True)`-safe values."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the generator states `capture_rng_state` returned (those this process has)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def weights_digest(model: Any) -> str:
    """sha256 over every parameter's name and bytes, in name order (equal digests = identical weights). A sharded
    model's parameters are gathered one at a time (`train.sharding.full_weights`: every rank must call it), so its
    digest is that of the same weights held whole."""
    from agentic_rl.train.sharding import full_weights

    each = sorted(
        (name, hashlib.sha256(p.cpu().contiguous().numpy().tobytes()).digest()) for name, p in full_weights(model)
    )
    digest = hashlib.sha256()
    for name, bytes_digest in each:
        digest.update(name.encode())
        digest.update(bytes_digest)
    return digest.hexdigest()
