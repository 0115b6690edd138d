"""Shared helpers of the benchmark scripts: a table printer, JSON results, goal verdicts, process memory readings
(current, peak, sampled), free loopback ports."""

from __future__ import annotations

import json
import operator
import os
import platform
import resource
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A right-aligned plain-text table; floats get 3 decimals."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=False))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)) for row in cells]
    return "\n".join(lines)


def result_path(name: str, quick: bool) -> Path:
    """Where a benchmark's JSON goes: `benchmarks/results/<name>.json`, or `results/quick/` for quick runs."""
    return (RESULTS / "quick" if quick else RESULTS) / f"{name}.json"


_OPS = {">=": (operator.ge, "<"), "<=": (operator.le, ">"), "==": (operator.eq, "!=")}


@dataclass(frozen=True)
class Goal:
    """One goal of a benchmark: `value op target`, e.g. `Goal("ideal/measured at 64 agents", 0.99, ">=", 0.98)`.

    `unit` follows both numbers ("x", " MB"); `digits` is how many decimals `value` is shown with.
    """

    what: str
    value: float
    op: str
    target: float
    unit: str = ""
    digits: int = 3

    @property
    def met(self) -> bool:
        return bool(_OPS[self.op][0](self.value, self.target))

    def __str__(self) -> str:
        op = self.op if self.met else _OPS[self.op][1]
        return f"{self.what} {self.value:.{self.digits}f}{self.unit} {op} {self.target:g}{self.unit}"


def verdict(*goals: Goal, note: str = "") -> str:
    """The line a benchmark ends with: `GOAL MET: ...` when every goal is met, `GOAL NOT MET: ...` otherwise, or
    `NO GOAL (report): <note>` when there are no goals. `note` is appended in parentheses."""
    if not goals:
        return f"NO GOAL (report): {note}"
    head = "GOAL MET" if all(g.met for g in goals) else "GOAL NOT MET"
    return f"{head}: " + "; ".join(map(str, goals)) + (f" ({note})" if note else "")


def save(name: str, results: dict[str, Any], out: str | None = None, quick: bool = False, goal: str | None = None) -> Path:
    """Write `results` (plus date, host, CPU count and mode) as JSON to `out` or `result_path(name, quick)`.

    `goal` (a `verdict` line) is stored as `"goal"` and printed last, so that it is the run's final line.
    """
    path = Path(out) if out else result_path(name, quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"date": date.today().isoformat(), "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "quick": quick}
    path.write_text(json.dumps({**meta, **results, **({"goal": goal} if goal else {})}, indent=2) + "\n")
    print(f"results written to {path}")
    if goal:
        print(goal)
    return path


def rss_bytes() -> int:
    """Current resident set size of this process, in bytes (Linux `/proc/self/statm`)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (`ru_maxrss` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def open_fds() -> int:
    """Number of open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


class PeakSampler:
    """Highest RSS a thread reads every `interval` seconds while the `with` block runs (and at both of its ends)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def free_port_pair() -> int:
    """A free loopback port P whose P + 1 is free too (a launcher's store, and a store one port up)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        try:
            with socket.socket() as b:
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def one_turn_trajectory(idx: int, reward: float, prompt: int, response: int, vocab: int) -> Any:
    """A one-turn `StepTrajectory` of `prompt` random prompt ids and `response` sampled ids in [100, vocab), with
    random logprobs (seeded by `idx`), rewarded `reward`: synthetic rows for the trainer's benchmarks."""
    import torch

    from agentic_rl.types import RunRecorder, Step, StepTrajectory

    g = torch.Generator().manual_seed(idx)
    recorder = RunRecorder()
    recorder.start(torch.randint(100, vocab, (prompt,), generator=g).tolist())
    ids = torch.randint(100, vocab, (response,), generator=g).tolist()
    run, span = recorder.sample(ids, (-torch.rand(response, generator=g) * 3).tolist(), 0)
    return StepTrajectory.from_runs(recorder.runs, idx=idx, trajectory_reward=reward, task={"id": "t"}, failed=False,
                                    steps=[Step(run=run, span=span, reward=reward)])  # fmt: skip
