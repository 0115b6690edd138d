"""A checkpoint's training state holds only what `torch.load(weights_only=True)` reads back: anything else (a
datetime or Decimal from a data file's extra columns, a NumPy scalar) fails at save time, naming where it is, and
leaves no checkpoint folder; the scheduler's pending groups are plain numbers and strings."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import numpy as np
import pytest
import torch

from agentic_rl.train.checkpoints import CheckpointError, check_loadable, load_state, save_checkpoint


class _Saves:
    """Stands for a model and a tokenizer: `save_pretrained` writes one file."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / self.name).write_text(self.name)


@pytest.mark.parametrize("bad", [datetime.datetime(2024, 1, 2), decimal.Decimal("1.25"), np.int64(3), np.float64(0.5)])
def test_a_state_weights_only_cannot_load_fails_at_save_time_and_leaves_no_checkpoint(tmp_path, bad):
    state = {"step": 1, "rollout": {"pending": [{"batch": 0, "task": {"id": "a", "when": bad}}]}}
    with pytest.raises(CheckpointError, match=r"state\['rollout'\]\['pending'\]\[0\]\['task'\]\['when'\]"):
        save_checkpoint(tmp_path / "step_1", _Saves("model"), _Saves("tokenizer"), state)
    assert not any(tmp_path.iterdir())  # neither the checkpoint nor a temporary folder


def test_a_plain_state_is_saved_and_loaded_with_weights_only(tmp_path):
    state = {"step": 2, "t": torch.arange(3), "rows": [{"loss": 0.5, "ok": True, "id": None}], "pair": (1, "x"),
             "dtype": torch.float32}  # fmt: skip
    check_loadable(state)
    save_checkpoint(tmp_path / "step_2", _Saves("model"), _Saves("tokenizer"), state)
    loaded = load_state(tmp_path / "step_2")
    assert loaded["rows"] == state["rows"] and loaded["pair"] == (1, "x") and torch.equal(loaded["t"], state["t"])
