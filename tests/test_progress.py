"""`StepProgress` off a terminal: a line every tenth of the run with the time spent and the time left, measured
from the first unit reported (set-up excluded), for training steps, resumed runs and rollout tasks."""

import io

from rich.console import Console

import agentic_rl.progress as progress_module
from agentic_rl.progress import StepProgress


class _Clock:
    """A clock the test moves: `monotonic()` reads `now`."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def _plain_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False)


def test_training_steps_log_reward_loss_and_the_time_left(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock.monotonic)
    said = lambda row: f"reward {row['reward_mean']:.3f} loss {row['loss']:.4f}"  # noqa: E731
    with StepProgress(10, "train", console=_plain_console(), describe=said) as bar:
        clock.now += 30.0  # set-up and the first step
        bar({"step": 1, "reward_mean": 0.1, "loss": 0.5})
        for step in range(2, 11):
            clock.now += 10.0  # 10 s a step from then on
            bar({"step": step, "reward_mean": 0.1 * step, "loss": 0.5})
    assert bar.lines[0] == "train: step 1/10, reward 0.100 loss 0.5000, 0:00:30 spent, 0:04:30 left"  # 30 s a step so far
    assert bar.lines[1] == "train: step 2/10, reward 0.200 loss 0.5000, 0:00:40 spent, 0:01:20 left"  # 10 s a step
    assert bar.lines[-1] == "train: step 10/10, reward 1.000 loss 0.5000, 0:02:00 spent, 0:00:00 left"
    assert len(bar.lines) == 10  # every tenth of 10 steps


def test_a_resumed_run_counts_its_time_left_from_its_own_first_step(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock.monotonic)
    with StepProgress(8, "train", console=_plain_console(), every=2, done=4) as bar:
        for step in range(5, 9):
            clock.now += 5.0
            bar({"step": step, "loss": 1.0})
    assert bar.lines == ["train: step 6/8, loss 1.000, 0:00:10 spent, 0:00:10 left",
                         "train: step 8/8, loss 1.000, 0:00:20 spent, 0:00:00 left"]  # fmt: skip


def test_rollout_tasks_log_the_count_and_the_time_left(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock.monotonic)
    with StepProgress(20, "rollout", console=_plain_console(), unit="task", describe=None) as bar:
        for done in range(1, 21):
            clock.now += 1.0
            bar({"done": done})
    assert bar.lines[0] == "rollout: task 2/20, 0:00:02 spent, 0:00:18 left"
    assert bar.lines[-1] == "rollout: task 20/20, 0:00:20 spent, 0:00:00 left"


def test_a_heartbeat_logs_what_is_done_and_left_until_its_block_ends():
    import threading

    import pytest

    from agentic_rl.progress import Heartbeat

    done = [0]
    beat = Heartbeat("held-out evaluation", 64, lambda: done[0], every_s=0.01)
    assert beat.line().startswith("held-out evaluation: 0/64 trajectories done, 0:00:00 spent")  # nothing left yet
    logged = threading.Event()
    with beat:
        done[0] = 16
        while not any(" 16/64 " in line for line in beat.lines):  # the beat thread logs on its own schedule
            logged.wait(0.01)
    assert any(line.startswith("held-out evaluation: 16/64 trajectories done, ") and line.endswith(" left")
               for line in beat.lines), beat.lines  # fmt: skip
    count = len(beat.lines)
    logged.wait(0.05)
    assert len(beat.lines) == count  # stopped with its block
    with pytest.raises(ValueError, match="boom"), Heartbeat("x", 1, lambda: 0, every_s=60):
        raise ValueError("boom")  # the block's own exception, untouched
