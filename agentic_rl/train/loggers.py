"""Where training metrics go: plain JSON Lines, TensorBoard event files, a wandb run in offline mode.

Every logger takes one metrics row per training step (the dict the training loop builds) and is closed once.
TensorBoard and wandb receive the numeric values only; JSON Lines keeps the row as it is. The TensorBoard and
wandb loggers need the `viz` extra (`tensorboard`, `wandb`); an offline wandb run is uploaded later, if ever, with
`wandb sync RUN_FOLDER`.

A resumed training run continues the same sinks from its first step to redo (`resume_from`): `metrics.jsonl` keeps
the rows of earlier steps only (a half-written last line included in what is dropped), TensorBoard purges the
events from that step on (`purge_step`), and wandb continues the same run id.
"""

from __future__ import annotations

import json
import logging
import math
import os
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
    "keep_steps_before",
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
    """Appends each row as one JSON line (with its `step`) to `path` (the run's `metrics.jsonl`).

    Args:
        path: the file.
        resume_from: continue an existing file from this step: rows of this step and later, and a half-written
            last line, are dropped first (the file is replaced atomically). None: append to the file as it is.

    Raises:
        ConfigError: with `resume_from`, naming a complete line that is not a JSON row with an integer `step`.
    """

    def __init__(self, path: str | Path, *, resume_from: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from is not None:
            keep_steps_before(self.path, resume_from)

    def log(self, row: Mapping[str, Any], *, step: int) -> None:
        """Append `{"step": step, **row}` as one line."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **row}) + "\n")

    def close(self) -> None:
        """Nothing to release: every line is written and closed by `log`."""


def keep_steps_before(path: str | Path, step: int) -> None:
    """Cut a JSON Lines file of per-step rows (`{"step": K, ...}`) back to the rows of steps before `step`, and
    drop a half-written last line: what a resumed run keeps of an earlier process's file before it appends. The file
    is replaced atomically; a missing one is created empty.

    Raises:
        ConfigError: naming `path:line` for a complete line that is not a JSON row with an integer `step`.
    """
    from agentic_rl.data import drop_partial_line, iter_jsonl

    path = Path(path)
    drop_partial_line(path)
    kept = []
    for lineno, row in iter_jsonl(path) if path.exists() else ():
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ConfigError(f"{path}:{lineno}: not a row with an integer 'step'")
        if row["step"] < step:
            kept.append(json.dumps(row) + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


class TensorBoardLogger:
    """Writes each numeric metric as a TensorBoard scalar (tag = metric name) under `log_dir`.

    Args:
        log_dir: the event file folder.
        purge_step: continue the run in `log_dir` from this step: readers drop the events the earlier files hold
            for this step and later ones (TensorBoard's `purge_step`).

    Raises:
        ConfigError: if the `tensorboard` package is not installed.
    """

    def __init__(self, log_dir: str | Path, *, purge_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch imports it lazily and needs the tensorboard package
            raise ConfigError(
                "the tensorboard logger needs the tensorboard package: pip install 'agentic-rl[viz]'"
            ) from exc
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

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

    Each row is committed as its step (not held until the next step's row), and the run file is flushed every
    `FLUSH_INTERVAL_S` (wandb's default is 15 s): a process killed later than that after logging a step keeps the
    step in its run file.

    Args:
        directory: the folder wandb writes its `wandb/` folder into (the run's output folder).
        project: the wandb project name recorded in the run.
        name: the run's display name.
        config: the run config recorded with it (e.g. the `TrainConfig` as a dict).
        resume: continue the newest offline run under `directory/wandb/` with the same run id (wandb's
            `resume="allow"`; each process writes its own `offline-run-*-ID` folder, `wandb sync` joins them);
            a new run when there is none.

    Raises:
        ConfigError: if the `wandb` package is not installed.
    """

    FLUSH_INTERVAL_S = 1.0

    def __init__(
        self,
        directory: str | Path,
        *,
        project: str = "agentic-rl",
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        resume: bool = False,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("the wandb logger needs the wandb package: pip install 'agentic-rl[viz]'") from exc
        Path(directory).mkdir(parents=True, exist_ok=True)
        earlier = sorted(Path(directory).glob("wandb/offline-run-*-*")) if resume else []
        same = {"id": earlier[-1].name.rsplit("-", 1)[1], "resume": "allow"} if earlier else {}
        self._run = wandb.init(
            project=project,
            name=name,
            dir=str(directory),
            mode="offline",
            config=dict(config or {}),
            settings=wandb.Settings(console="off", silent=True, x_transaction_log_flush_interval=self.FLUSH_INTERVAL_S),
            **same,
        )
        self.run_dir = Path(self._run.dir).parent  # `.../offline-run-*/files` -> the run folder
        logger.info("wandb offline run %s in %s%s", self._run.id, self.run_dir, " (resumed)" if same else "")

    @property
    def run_id(self) -> str:
        """The wandb run id (the same across the processes of a resumed run)."""
        return self._run.id

    def log(self, row: Mapping[str, Any], *, step: int) -> None:
        """Log the numeric metrics at wandb step `step` (committed at once)."""
        self._run.log(_scalars(row), step=step, commit=True)

    def close(self) -> None:
        """Finish the run (writes the rest of its run file)."""
        self._run.finish()


def build_loggers(
    names: Sequence[str],
    output_dir: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    wandb_project: str = "agentic-rl",
    resume_from: int | None = None,
) -> list[MetricsLogger]:
    """The loggers named in `names`, writing under `output_dir`.

    `jsonl` -> `output_dir/metrics.jsonl`; `tensorboard` -> event files in `output_dir/tensorboard/`;
    `wandb` -> an offline run in `output_dir/wandb/`, recording `config`. With `resume_from` (the first step a
    resumed run logs; 0 = it starts over), each continues what an earlier process of the run wrote from that step
    (see the module docstring).

    Raises:
        ConfigError: for an unknown or repeated name, a logger whose package is missing, or (resuming) a
            `metrics.jsonl` line that is not a metrics row.
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
                built.append(JsonlLogger(out / "metrics.jsonl", resume_from=resume_from))
            elif name == "tensorboard":
                built.append(TensorBoardLogger(out / "tensorboard", purge_step=resume_from))
            else:
                built.append(
                    WandbLogger(
                        out,
                        project=wandb_project,
                        name=out.resolve().name,
                        config=config,
                        resume=resume_from is not None,
                    )
                )
    except BaseException:
        for made in built:
            made.close()
        raise
    return built
