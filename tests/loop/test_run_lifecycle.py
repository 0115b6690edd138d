"""A training run's set-up is all or nothing and its teardown never fails it, in process on the tiny random model:
a bad LoRA target fails before the engine starts, naming it; a failure after the engine started (the environment
cannot be built) closes the engine; an environment whose `aclose` raises neither fails a finished run nor keeps the
engine alive. After each, no engine thread is left."""

from __future__ import annotations

import threading

import pytest
from support.train_runs import write_train_config

from agentic_rl.errors import ConfigError
from agentic_rl.loop import load_train_config, run_training

ENGINE_THREAD = "agentic-rl-engine"  # `VLLMEngine`'s thread


def _engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == ENGINE_THREAD and t.is_alive()]


def _config(tmp_path, *overrides: str, **extra):
    return load_train_config(write_train_config(tmp_path, steps=1, **extra), list(overrides))


@pytest.mark.slow
def test_lora_target_modules_the_model_lacks_fail_before_the_engine_starts(tmp_path, caplog):
    optimizer = {"lr": 1.0e-3, "micro_batch_size": 3, "lora": {"rank": 4, "target_modules": ["nonexistent_proj"]}}
    config = _config(tmp_path, optimizer=optimizer)
    assert not _engine_threads()
    with pytest.raises(ConfigError, match="nonexistent_proj"):
        run_training(config)
    assert not _engine_threads()
    assert "engine started" not in caplog.text  # refused before the engine was built


@pytest.mark.slow
def test_a_failure_after_the_engine_started_closes_it(tmp_path, caplog):
    config = _config(tmp_path, environment={"class": "support.lifecycle_envs:FailsToBuild"})
    with pytest.raises(ConfigError, match="FailsToBuild cannot be built"):
        run_training(config)
    assert "engine started" in caplog.text  # it did start: the failure came after
    assert not _engine_threads()


@pytest.mark.slow
def test_an_environment_that_fails_to_close_neither_fails_the_run_nor_keeps_the_engine(tmp_path, caplog):
    config = _config(tmp_path, environment={"class": "support.lifecycle_envs:FailsToClose"})
    rows = run_training(config)
    assert [r["step"] for r in rows] == [1]
    assert (tmp_path / "run" / "checkpoints" / "final").is_dir()
    assert "FailsToClose cannot close" in caplog.text
    assert not _engine_threads()
