"""A resumed run's ranks all follow rank 0's choice of checkpoint and its answer to "finished already?", even where
a rank's view of the run folder lags (a shared file system on several nodes): two gloo ranks on 127.0.0.1."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from support.launch import run_gloo_ranks

from agentic_rl.train.checkpoints import FINAL, STATE_FILE

# Each rank resumes the run folder given for it, and prints what it resumes and whether the run is finished.
_RESUME = """
import sys
from types import SimpleNamespace
from agentic_rl.loop.setup import starting_point
from agentic_rl.train.distributed import init_from_env
ctx = init_from_env("cpu", timeout_s=60)
start, state, done = starting_point(SimpleNamespace(output_dir=sys.argv[1], steps=3), ctx, resume=True)
print(None if start is None else start.path.name, None if state is None else state["step"], done)
ctx.close()
"""


def _finished_run(out: Path) -> None:
    final = out / "checkpoints" / FINAL
    final.mkdir(parents=True)
    torch.save({"world_size": 2, "step": 3}, final / STATE_FILE)
    for rank in range(2):
        (out / f"weights_rank{rank}.sha256").write_text("0" * 64)


def test_a_rank_whose_view_of_the_folder_lags_follows_rank_zero(tmp_path):
    _finished_run(tmp_path / "rank0")
    shutil.copytree(tmp_path / "rank0", tmp_path / "rank1")
    (tmp_path / "rank1" / "weights_rank1.sha256").unlink()  # not yet visible to rank 1: alone, it would go on
    outputs = run_gloo_ranks(["-c", _RESUME, str(tmp_path / "rank{rank}")], timeout_s=120)
    assert [out.strip() for out in outputs] == ["final 3 True", "final 3 True"]


def test_without_a_complete_checkpoint_every_rank_starts_over(tmp_path):
    for rank in range(2):
        (tmp_path / f"rank{rank}" / "checkpoints" / ".tmp-step_1").mkdir(parents=True)
    outputs = run_gloo_ranks(["-c", _RESUME, str(tmp_path / "rank{rank}")], timeout_s=120)
    assert [out.strip() for out in outputs] == ["None None False", "None None False"]
    assert not (tmp_path / "rank0" / "checkpoints" / ".tmp-step_1").exists()  # rank 0 removes what a kill left
