"""A batch of trajectories that can be quiesced at turn boundaries and resumed later (also across a weight update).

`Rollout.run(tasks)` runs tasks like `run_tasks` + `run_trajectory`. `await rollout.quiesce()` stops dispatching
new tasks, lets every turn in flight finish (a generation is never interrupted; its environment step runs too),
then checkpoints each unfinished trajectory at the next turn boundary. It returns a `SuspendedRollout`: the tasks
not started yet and one `TrajectoryCheckpoint` per suspended trajectory. `rollout.resume(suspended)` continues
them; with greedy decoding, the same weights and the same batch composition the final trajectories equal those of
an uninterrupted run. Every turn records the engine's `weight_version`, and every sampled token the version whose
weights sampled it (`TokenRun.weight_versions`), so a trajectory resumed after `engine.update_weights` says which
weights sampled each turn.

Suspended trajectories keep their environment open (tool sessions, sandbox processes): resume them in the same
process with the same `Rollout`, or call `discard` to close them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentic_rl.errors import ConfigError
from agentic_rl.rollout.bounded import close_quietly, close_sample
from agentic_rl.rollout.contracts import check_environment, check_reward
from agentic_rl.rollout.harness import TrajectoryCheckpoint, run_trajectory
from agentic_rl.rollout.loop_lag import watch_loop_lag
from agentic_rl.rollout.runner import batch_indices, check_n_parallel_agents, run_batch
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.rollout.tasks import checked_task, failed_trajectory
from agentic_rl.types import StepTrajectory, TerminationReason

__all__ = ["Rollout", "RolloutResult", "SuspendedRollout"]

logger = logging.getLogger(__name__)


@dataclass
class SuspendedRollout:
    """What `Rollout.quiesce` hands back: work that has not finished.

    Attributes:
        queued: `(idx, task)` of each task that had not started, in index order.
        checkpoints: one `TrajectoryCheckpoint` per trajectory stopped at a turn boundary, in index order; their
            environments are still open.
    """

    queued: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[TrajectoryCheckpoint] = field(default_factory=list)

    @property
    def indices(self) -> list[int]:
        """Batch indices of every unfinished task, sorted."""
        return sorted([idx for idx, _ in self.queued] + [cp.idx for cp in self.checkpoints])

    def __len__(self) -> int:
        return len(self.queued) + len(self.checkpoints)


@dataclass
class RolloutResult:
    """What one `Rollout.run` or `Rollout.resume` call produced.

    Attributes:
        trajectories: the trajectories that ended during the call (completed or failed), in index order.
        suspended: the unfinished work if the call was quiesced, else None.
    """

    trajectories: list[StepTrajectory]
    suspended: SuspendedRollout | None = None


class Rollout:
    """Runs trajectories with at most `n_parallel_agents` in flight; can be quiesced and resumed.

    Args:
        spec: what every trajectory runs on (`RolloutSpec`).
        n_parallel_agents: trajectories in flight at once, >= 1 (the AgentSDK's range, [1, 64], is checked where
            its settings enter: the wrapper and the configs).

    Raises:
        ConfigError: if `n_parallel_agents` is not a positive int, or the spec's environment (its tools) or reward
            breaks what the harness calls on it (`rollout.contracts`), naming the method and what is wrong.
    """

    def __init__(self, spec: RolloutSpec, *, n_parallel_agents: int = 8) -> None:
        self.n_parallel_agents = check_n_parallel_agents(n_parallel_agents)
        check_environment(spec.environment, what="spec.environment")  # what the harness calls, before any task
        if spec.reward_fn is not None:
            check_reward(spec.reward_fn, what="spec.reward_fn")
        self.spec = spec
        self._pause: anyio.Event | None = None
        self._done: anyio.Event | None = None
        self._last_suspended = SuspendedRollout()

    @property
    def running(self) -> bool:
        """True while a `run` or `resume` call is in progress."""
        return self._done is not None and not self._done.is_set()

    async def run(
        self,
        tasks: Sequence[dict[str, Any]],
        *,
        on_result: Callable[[StepTrajectory], None] | None = None,
        indices: Sequence[int] | None = None,
    ) -> RolloutResult:
        """Run one trajectory per task until all end or `quiesce` stops the call.

        A malformed task gives a failed trajectory (`invalid_task`) without stopping the others.

        Args:
            tasks: the tasks.
            on_result: called with each trajectory as it ends.
            indices: each task's batch index (`Trajectory.idx`, which also offsets its sampling seed); default 0,
                1, ... A run that continues an interrupted one passes its remaining tasks' original positions.

        Raises:
            ConfigError: if a `run` or `resume` of this rollout is already in progress, or `indices` is not one
                distinct index per task.
        """
        order = batch_indices(tasks, indices)
        return await self._drive(list(zip(order, tasks, strict=True)), [], on_result)

    async def resume(
        self, suspended: SuspendedRollout, *, on_result: Callable[[StepTrajectory], None] | None = None
    ) -> RolloutResult:
        """Continue the work `quiesce` handed back: checkpoints first, then queued tasks, each in index order.

        Raises:
            ConfigError: if a `run` or `resume` of this rollout is already in progress.
        """
        checkpoints = sorted(suspended.checkpoints, key=lambda cp: cp.idx)
        return await self._drive(sorted(suspended.queued, key=lambda item: item[0]), checkpoints, on_result)

    def request_quiesce(self) -> None:
        """Ask the call in progress to quiesce, without waiting (safe from callbacks); a no-op when idle."""
        if self._pause is not None:
            self._pause.set()

    async def quiesce(self) -> SuspendedRollout:
        """Stop dispatching, let in-flight turns finish, and checkpoint every unfinished trajectory.

        The `run`/`resume` call in progress then returns with the same `SuspendedRollout` in its result.

        Returns:
            The unfinished work (empty when no call is in progress or everything had finished).
        """
        if not self.running:
            return SuspendedRollout()
        done = self._done
        self.request_quiesce()
        assert done is not None
        await done.wait()
        return self._last_suspended

    async def discard(self, suspended: SuspendedRollout) -> None:
        """Close the environment of every checkpoint in `suspended` (for work that will not be resumed); each close
        is shielded and bounded by `close_timeout_s`, and a failure is logged, not raised."""
        for checkpoint in suspended.checkpoints:
            await close_sample(
                self.spec.environment, checkpoint.sample, checkpoint.idx, self.spec.config.close_timeout_s
            )
        suspended.checkpoints.clear()
        suspended.queued.clear()

    async def aclose(self) -> None:
        """Release what the environment holds across trajectories (`Environment.aclose`: its tools' clients) once
        the rollouts are over. Shielded from cancellation and bounded by `config.close_timeout_s`; a timeout or an
        exception is logged as a warning naming the environment's class and never raised, so that a finished run is
        not turned into a failed one and a failing run's own error is not masked."""
        await close_quietly(self.spec.environment.aclose, self.spec.config.close_timeout_s)

    async def _drive(
        self,
        queued: list[tuple[int, Any]],
        checkpoints: list[TrajectoryCheckpoint],
        on_result: Callable[[StepTrajectory], None] | None,
    ) -> RolloutResult:
        if self.running:
            raise ConfigError("this Rollout is already running: quiesce it or wait for it before run/resume")
        pause, done = anyio.Event(), anyio.Event()
        self._pause, self._done = pause, done
        left = SuspendedRollout()

        async def one(idx: int, item: tuple[Any, TrajectoryCheckpoint | None]) -> StepTrajectory | None:
            task, checkpoint = item
            if pause.is_set():  # dispatch is paused: hand the work back untouched
                if checkpoint is None:
                    left.queued.append((idx, task))
                else:
                    left.checkpoints.append(checkpoint)
                return None
            result = await self._run_one(idx, task, checkpoint, pause)
            if isinstance(result, TrajectoryCheckpoint):
                left.checkpoints.append(result)
                return None
            return result

        items = [(cp.idx, (cp.task, cp)) for cp in checkpoints] + [(idx, (task, None)) for idx, task in queued]
        watch = functools.partial(watch_loop_lag, type(self.spec.environment).__qualname__)
        try:
            finished = await run_batch(
                items, one, n_parallel_agents=self.n_parallel_agents, on_result=on_result, watch=watch
            )
        finally:
            left.queued.sort(key=lambda item: item[0])
            left.checkpoints.sort(key=lambda cp: cp.idx)
            self._last_suspended = left
            self._pause = None
            done.set()
        trajectories = [finished[idx] for idx in sorted(finished)]
        logger.log(  # once per group in a training run: at INFO only when work was handed back
            logging.INFO if len(left) else logging.DEBUG,
            "rollout call ended: %d finished, %d queued, %d suspended",
            len(trajectories),
            len(left.queued),
            len(left.checkpoints),
        )
        return RolloutResult(trajectories, left if len(left) else None)

    async def _run_one(
        self, idx: int, task: Any, checkpoint: TrajectoryCheckpoint | None, pause: anyio.Event
    ) -> StepTrajectory | TrajectoryCheckpoint:
        if checkpoint is None:
            task = checked_task(idx, task)
            if isinstance(task, StepTrajectory):
                return task
        try:
            return await run_trajectory(task, idx, self.spec, pause=pause, checkpoint=checkpoint)
        except Exception as exc:  # run_trajectory turns failures into results; this guards against a bug in it
            logger.exception("trajectory %d raised", idx)
            return failed_trajectory(idx, task, TerminationReason.ERROR, f"{type(exc).__name__}: {exc}")
