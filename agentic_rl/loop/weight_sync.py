"""How the training loop moves the trainer's weights into its engine, with full fine-tuning or a LoRA adapter.

Full fine-tuning pushes every weight (`VLLMEngine.update_weights(trainer.named_weights())`). With `optimizer.lora`
the engine serves the frozen base model with LoRA turned on (`max_lora_rank`, `max_loras`) and each sync writes the
adapter into a fresh folder on tmpfs (`/dev/shm` where there is one) and loads it as the next weight version
(`VLLMEngine.update_adapter(folder)`). A request in flight keeps the adapter it started with, so the folders of the
newest `max_loras` versions are kept (the engine may reload one from disk) and older ones removed; `close` removes
them all, and the folders of a killed run are removed by the next LoRA run (`remove_orphaned_folders`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from agentic_rl.loop.config import TrainConfig

if TYPE_CHECKING:
    from agentic_rl.engine.base import TrainableEngine
    from agentic_rl.train.trainer import GRPOTrainer

__all__ = ["WeightSync", "remove_orphaned_folders", "restore_weights"]

logger = logging.getLogger(__name__)

#: Where adapter folders go: memory-backed, so a sync never waits on a disk.
TMPFS = Path("/dev/shm")


#: Adapter folders are `<parent>/agentic-rl-lora-<pid>-<random>`: a run that was killed cannot remove its own, so
#: the next LoRA run on the machine removes those whose process is gone (`remove_orphaned_folders`).
FOLDER_PREFIX = "agentic-rl-lora-"


def remove_orphaned_folders(parent: Path) -> list[Path]:
    """Remove the adapter folders under `parent` whose run's process no longer exists; the removed folders."""
    removed = []
    for folder in parent.glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def restore_weights(trainer: GRPOTrainer, folder: Path, state: dict[str, Any]) -> None:
    """Load a checkpoint's weights (the whole model, or with LoRA the adapter) and training state into `trainer`. A
    sharded trainer reads a sharded checkpoint (every rank its own chunks, the optimizer state with them:
    `train.sharded_checkpoints`), and only such a one.

    Raises:
        ConfigError: for a sharded checkpoint and a trainer that is not sharded, or the other way round.
        CheckpointError: for shards that do not fit the trainer's model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.train.lora import load_adapter
    from agentic_rl.train.sharded_checkpoints import is_sharded_checkpoint, load_sharded_checkpoint

    if is_sharded_checkpoint(folder) != trainer.sharded:
        from agentic_rl.errors import ConfigError

        kind = "sharded" if trainer.sharded else "replicated"
        raise ConfigError(
            f"{folder} is {'not ' if trainer.sharded else ''}a sharded checkpoint, and this run's trainer is {kind} "
            f"(optimizer.sharding, ranks): resume it as it was written, or start a new run from its model "
            f"('agentic-rl merge --checkpoint {folder} --out DIR')"
        )
    if trainer.sharded:
        load_sharded_checkpoint(folder, trainer)
    elif trainer.config.lora is not None:
        load_adapter(trainer.module, folder)
    else:
        saved = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        trainer.module.load_state_dict(saved.state_dict())  # copied onto the module's device
    trainer.load_state_dict(state["trainer"])


class WeightSync:
    """Pushes a `GRPOTrainer`'s weights into a `TrainableEngine`: all of them, or its LoRA adapter (module docstring).

    Args:
        trainer: the run's `GRPOTrainer`.
        engine: its colocated engine; with LoRA it must have `update_adapter` (and LoRA on:
            `loop.plan.lora_engine_options`).
        keep: adapter folders kept on tmpfs (the engine's `max_loras`).
    """

    def __init__(self, trainer: GRPOTrainer, engine: TrainableEngine, *, keep: int = 1) -> None:
        self.trainer = trainer
        self.engine = engine
        self.keep = max(keep, 1)
        self.lora = trainer.config.lora is not None
        self._root: Path | None = None
        self._folders: list[Path] = []

    @classmethod
    def of(cls, config: TrainConfig, trainer: GRPOTrainer, engine: TrainableEngine) -> WeightSync:
        """The sync of a training run's trainer and engine, keeping `rollout.max_staleness + 1` adapters."""
        return cls(trainer, engine, keep=config.rollout.max_staleness + 1)

    async def push(self) -> None:
        """Move the trainer's current weights into the engine as its next weight version.

        Raises:
            ConfigError: with LoRA, if the engine cannot load an adapter.
            EngineError / OSError: from the engine or the file system.
        """
        if not self.lora:
            await self.engine.update_weights(self.trainer.named_weights())
            return
        if not hasattr(self.engine, "update_adapter"):
            from agentic_rl.errors import ConfigError

            raise ConfigError(
                f"optimizer.lora needs an engine that loads LoRA adapters (update_adapter), got "
                f"{type(self.engine).__name__}"
            )
        if self._root is None:
            parent = TMPFS if TMPFS.is_dir() else Path(tempfile.gettempdir())
            remove_orphaned_folders(parent)
            self._root = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=parent))
        folder = self._root / f"version_{self.engine.weight_version + 1}"
        await anyio.to_thread.run_sync(self.trainer.save_adapter, folder)
        self._folders.append(folder)
        await self.engine.update_adapter(folder)
        while len(self._folders) > self.keep:
            shutil.rmtree(self._folders.pop(0), ignore_errors=True)

    async def at_start(self, *, resumed: bool, world_size: int) -> None:
        """Before the first step: a resumed LoRA run loads its checkpoint's adapter (restored into the trainer) into
        the engine, which starts from the base model, and so does a resumed sharded run with the checkpoint's
        weights (restored into the trainer's shards: the checkpoint holds no whole model for the engine to start
        from); a new run on several ranks gives every engine rank 0's weights (with LoRA there is nothing to give:
        every engine serves the same base, the adapter's B is 0)."""
        from_checkpoint = resumed and (self.lora or self.trainer.sharded)
        if from_checkpoint or (not self.lora and not resumed and world_size > 1):
            try:
                await self.push()
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Remove the adapter folders (after the engine is closed, or when it no longer needs them)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root, self._folders = None, []
