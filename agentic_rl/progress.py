"""How a long command shows its progress to a person: a bar on a terminal, plain log lines with time left elsewhere.

`StepProgress` counts units of work (training steps, SFT steps, rollout tasks): on a terminal a rich bar with the
time spent and left; off a terminal (a log file, a pipe, a CI job), so that the output stays readable, one INFO line
every tenth of the run and at its end, `label: step 40/100, reward 0.312, 0:01:10 spent, 0:01:45 left`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

__all__ = ["Heartbeat", "StepProgress"]

logger = logging.getLogger(__name__)


def _clock(seconds: float) -> str:
    """`seconds` as ``H:MM:SS``."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _loss(row: Mapping[str, Any]) -> str:
    return f"loss {float(row['loss']):.3f}"


class StepProgress:
    """Shows the units of a run done so far (steps, tasks), what the last one said, time spent and time left.

    On a terminal (and with `bar`) a rich progress bar on `console`; otherwise one INFO line of this module's logger
    every `every` units and at the last. Lines too when another rich bar is already showing (a training run that
    builds the tool model): they print above it. Use as a context manager and call it with each finished unit's row.

    Args:
        total: units of the run.
        label: what the run is, first on the bar and in every line (e.g. ``"fine-tuning for tool calls"``).
        bar: False never draws a bar (``--no-progress``): lines are logged instead.
        console: a `rich.console.Console` for the bar (default: one on stderr).
        every: units between two lines (default: a tenth of `total`, at least 1).
        unit: the unit's name in the lines (``step``, ``task``).
        done: units done before this run (a resumed run's); the time left is measured from the first unit after.
        describe: what a row says beside the count (default: its ``loss``, 3 decimals); None for nothing.
    """

    def __init__(
        self,
        total: int,
        label: str = "sft",
        *,
        bar: bool = True,
        console: Any = None,
        every: int | None = None,
        unit: str = "step",
        done: int = 0,
        describe: Callable[[Mapping[str, Any]], str] | None = _loss,
    ) -> None:
        from rich.console import Console

        self.total, self.label, self.unit, self.done, self.describe = total, label, unit, done, describe
        self.console = console if console is not None else Console(stderr=True)
        self.every = every if every is not None else max(1, total // 10)
        self.lines: list[str] = []  # the lines logged so far
        self._bar: Any = None
        self._use_bar = bar and self.console.is_terminal
        self._start = time.monotonic()
        self._first: tuple[float, int] | None = None  # (time, unit) of the first unit reported

    def __enter__(self) -> StepProgress:
        from rich import progress
        from rich.file_proxy import FileProxy

        self._start = time.monotonic()
        if self._use_bar and not isinstance(sys.stderr, FileProxy):  # no second bar inside another one (a run's)
            columns = [
                progress.TextColumn(self.label),
                progress.BarColumn(),
                progress.TextColumn(self.unit),
                progress.MofNCompleteColumn(),
                progress.TextColumn("{task.fields[said]}"),
                progress.TimeElapsedColumn(),
                progress.TextColumn("left"),
                progress.TimeRemainingColumn(),
            ]
            self._bar = progress.Progress(*columns, console=self.console)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total, completed=self.done, said="")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, row: Mapping[str, Any]) -> None:
        """Report one finished unit: `row` holds the 1-based count of units done, ``step`` (a training or SFT step's
        metrics row) or ``done``, and whatever `describe` reads."""
        step = int(row["step"] if "step" in row else row["done"])
        said = self.describe(row) if self.describe is not None else ""
        if self._bar is not None:
            self._bar.update(self._task, completed=step, said=said)
            return
        if self._first is None:  # time per unit is measured from the first unit on, not from set-up
            self._first = (time.monotonic(), step)
        if step % self.every and step != self.total:
            return
        now = time.monotonic()
        since, first = self._first
        per_unit = (now - since) / (step - first) if step > first else (now - self._start) / max(step - self.done, 1)
        spent, left = now - self._start, per_unit * (self.total - step)
        parts = [
            f"{self.label}: {self.unit} {step}/{self.total}",
            said,
            f"{_clock(spent)} spent",
            f"{_clock(left)} left",
        ]
        line = ", ".join(part for part in parts if part)
        self.lines.append(line)
        logger.info("%s", line)


class Heartbeat:
    """A line every `every_s` seconds while a long phase runs (a step's rollout, a held-out evaluation), so that a
    log never goes quiet for long: `label: 12/64 trajectories done, 0:01:30 spent, 0:06:00 left` (the time left at
    the pace so far; none before the first is done).

    Use as `with Heartbeat(...)`: a daemon thread logs while the block runs (the block's exceptions pass through
    untouched) and stops with it.

    Args:
        label: the phase (e.g. ``"step 3 rollout"``).
        total: units of the phase; `done` reads how many are done (from the heartbeat's thread: a plain count).
        unit: their name in the line (plural).
        every_s: seconds between two lines (30 by default).
    """

    def __init__(self, label: str, total: int, done: Callable[[], int], *, unit: str = "trajectories",
                 every_s: float = 30.0) -> None:  # fmt: skip
        self.label, self.total, self.done, self.unit, self.every_s = label, total, done, unit, every_s
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="agentic-rl-heartbeat", daemon=True)
        self._start = time.monotonic()

    def __enter__(self) -> Heartbeat:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def line(self) -> str:
        """The line for now."""
        done, spent = self.done(), time.monotonic() - self._start
        parts = [f"{self.label}: {done}/{self.total} {self.unit} done", f"{_clock(spent)} spent"]
        if 0 < done < self.total:
            parts.append(f"{_clock(spent / done * (self.total - done))} left")
        return ", ".join(parts)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            line = self.line()
            self.lines.append(line)
            logger.info("%s", line)
