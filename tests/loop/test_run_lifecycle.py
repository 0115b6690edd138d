"""A training run's set-up is all or nothing and its teardown never fails it, on the tiny random model: a bad LoRA
target fails before the engine starts, naming it; a failure after the engine started (the environment cannot be
built) closes the engine; an environment whose `aclose` raises neither fails a finished run nor keeps the engine
alive. After each, no engine thread is left in the process (`support.lifecycle_check`, run in a process of its own
so that the engine it closes cannot disturb this session's)."""

from __future__ import annotations

import sys

import pytest
from support.processes import run


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bad_lora_target", "fails_after_engine", "fails_to_close"])
def test_set_up_and_teardown_leave_no_engine_thread(tmp_path, case):
    proc = run([sys.executable, "-m", "support.lifecycle_check", case, str(tmp_path)], timeout_s=900)
    assert f"PASS {case}" in proc.stdout
