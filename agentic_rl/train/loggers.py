"""Where training metrics go: plain JSON Lines, TensorBoard event files, a wandb run in offline mode.

Every logger takes one metrics row per training step (the dict the training loop builds) and is closed once.
TensorBoard and wandb receive the numeric values only; JSON Lines keeps the row as it is. The TensorBoard and
wandb loggers need the `viz` extra (`tensorboard`, `wandb`); an offline wandb run is uploaded later, if ever, with
`wandb sync RUN_FOLDER`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from agentic_rl.errors import ConfigError

__all__ = [
    "LOGGER_NAMES",
    "JsonlLogger",
    "LoggerName",
    "MetricsLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "build_loggers",
]

logger = logging.getLogger(__name__)

LoggerName = Literal["jsonl", "tensorboard", "wandb"]
LOGGER_NAMES: tuple[str, ...] = ("jsonl", "tensorboard", "wandb")


@runtime_checkable
class MetricsLogger(Protocol):
    """A sink for per-step metrics rows."""

    def log(self, row: Mapping[str, Any], *, step: int) -> None:
        """Record the metrics of training step `step` (1-based)."""
        ...

    def close(self) -> None:
        """Flush and release files or processes; called once, after the last `log`."""
        ...


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of `row` except `step` (booleans count as 0/1)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


class JsonlLogger:
    """Appends each row as one JSON line (with its `step`) to `path` (the run's `metrics.jsonl`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, row: Mapping[str, Any], *, step: int) -> None:
        """Append `{"step": step, **row}` as one line."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **row}) + "\n")

    def close(self) -> None:
        """Nothing to release: every line is written and closed by `log`."""


class TensorBoardLogger:
    """Writes each numeric metric as a TensorBoard scalar (tag = metric name) under `log_dir`.

    Raises:
        ConfigError: if the `tensorboard` package is not installed.
    """

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch imports it lazily and needs the tensorboard package
            raise ConfigError("the tensorboard logger needs the tensorboard package: pip install 'agentic-rl[viz]'") from exc
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, row: Mapping[str, Any], *, step: int) -> None:
        """Add one scalar per numeric metric at global step `step`."""
        for key, value in _scalars(row).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class WandbLogger:
    """Logs into a wandb run in offline mode (files under `directory/wandb/offline-run-*`; nothing is sent).

    Args:
        directory: the folder wandb writes its `wandb/` folder into (the run's output folder).
        project: the wandb project name recorded in the run.
        name: the run's display name.
        config: the run config recorded with it (e.g. the `TrainConfig` as a dict).

    Raises:
        ConfigError: if the `wandb` package is not installed.
    """

    def __init__(self, directory: str | Path, *, project: str = "agentic-rl", name: str | None = None,
                 config: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("the wandb logger needs the wandb package: pip install 'agentic-rl[viz]'") from exc
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project, name=name, dir=str(directory), mode="offline", config=dict(config or {}),
            settings=wandb.Settings(console="off", silent=True),
        )  # fmt: skip
        self.run_dir = Path(self._run.dir).parent  # `.../offline-run-*/files` -> the run folder
        logger.info("wandb offline run in %s", self.run_dir)

    def log(self, row: Mapping[str, Any], *, step: int) -> None:
        """Log the numeric metrics at wandb step `step`."""
        self._run.log(_scalars(row), step=step)

    def close(self) -> None:
        """Finish the run (writes the rest of its run file)."""
        self._run.finish()


def build_loggers(
    names: Sequence[str],
    output_dir: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    wandb_project: str = "agentic-rl",
) -> list[MetricsLogger]:
    """The loggers named in `names`, writing under `output_dir`.

    `jsonl` -> `output_dir/metrics.jsonl`; `tensorboard` -> event files in `output_dir/tensorboard/`;
    `wandb` -> an offline run in `output_dir/wandb/`, recording `config`.

    Raises:
        ConfigError: for an unknown or repeated name, or a logger whose package is missing.
    """
    unknown = [n for n in names if n not in LOGGER_NAMES]
    if unknown:
        raise ConfigError(f"unknown logger(s) {unknown}; available: {', '.join(LOGGER_NAMES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"loggers must not repeat, got {list(names)}")
    out = Path(output_dir)
    built: list[MetricsLogger] = []
    try:
        for name in names:
            if name == "jsonl":
                built.append(JsonlLogger(out / "metrics.jsonl"))
            elif name == "tensorboard":
                built.append(TensorBoardLogger(out / "tensorboard"))
            else:
                built.append(WandbLogger(out, project=wandb_project, name=out.resolve().name, config=config))
    except BaseException:
        for made in built:
            made.close()
        raise
    return built
