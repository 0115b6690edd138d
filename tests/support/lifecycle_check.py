"""The in-process checks of `tests/loop/test_run_lifecycle.py`, run in a process of their own: a training run starts
and closes a vLLM engine, and vLLM's process-wide state (its parallel groups) does not survive an engine closed
beside the test session's own. `python -m support.lifecycle_check CASE FOLDER` exits 0 when the case holds."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config, run_training
from support.train_runs import write_train_config

ENGINE_THREAD = "agentic-rl-engine"  # `VLLMEngine`'s thread


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == ENGINE_THREAD and t.is_alive()]


def _refused(config, match: str) -> None:
    try:
        run_training(config)
    except ConfigError as exc:
        assert match in str(exc), exc
    else:
        raise AssertionError(f"the run was not refused ({match})")


def main(case: str, folder: Path) -> None:
    records = _Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.INFO)
    assert not _engine_threads()
    if case == "bad_lora_target":
        optimizer = {"lr": 1.0e-3, "micro_batch_size": 3, "lora": {"rank": 4, "target_modules": ["nonexistent_proj"]}}
        _refused(load_train_config(write_train_config(folder, steps=1, optimizer=optimizer)), "nonexistent_proj")
        assert "engine started" not in records.text  # refused before the engine was built
    elif case == "fails_after_engine":
        environment = {"class": "support.lifecycle_envs:FailsToBuild"}
        _refused(load_train_config(write_train_config(folder, steps=1, environment=environment)), "FailsToBuild cannot be built")
        assert "engine started" in records.text  # it did start: the failure came after
    elif case == "fails_to_close":
        environment = {"class": "support.lifecycle_envs:FailsToClose"}
        rows = run_training(load_train_config(write_train_config(folder, steps=1, environment=environment)))
        assert [r["step"] for r in rows] == [1]
        assert (folder / "run" / "checkpoints" / "final").is_dir()
        assert "FailsToClose cannot close" in records.text
    else:
        raise SystemExit(f"unknown case {case!r}")
    assert not _engine_threads(), _engine_threads()
    print("PASS", case)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
