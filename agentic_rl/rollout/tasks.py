"""Tasks as the rollout takes them: validation, and the failed trajectory that stands for a task that cannot run."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from agentic_rl.errors import ConfigError
from agentic_rl.types import StepTrajectory, TerminationReason

__all__ = ["Task", "checked_task", "failed_trajectory", "validate_task"]

logger = logging.getLogger(__name__)


class Task(BaseModel):
    """One task: `{"id", "question", "ground_truth"}`, optionally its own `system_prompt` (used instead of the
    environment's); extra keys are kept for the environment and reward."""

    model_config = ConfigDict(extra="allow")

    id: StrictStr | StrictInt
    question: Annotated[StrictStr, Field(min_length=1, pattern=r"\S")]
    ground_truth: StrictStr | StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)]
    system_prompt: StrictStr | None = None


class WorkspaceTask(Task):
    """A coding task (it names a `workspace`): its tests judge it, so a `ground_truth` is optional."""

    ground_truth: StrictStr | StrictInt | Annotated[StrictFloat, Field(allow_inf_nan=False)] | None = None


def _first_error(exc: ValidationError) -> tuple[str, Any, str]:
    """`(field, offending value or None when missing, message)` of the first error pydantic reported."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else "?"
    value = None if err["type"] == "missing" else err.get("input")  # a missing field's "input" is the whole row
    return field, value, err["msg"]


def validate_task(task: Any) -> dict[str, Any]:
    """Check one task and return it as a plain dict. A coding task (one with a `workspace`) needs no
    `ground_truth`: its tests judge it.

    Raises:
        ConfigError: naming the first missing or malformed field.
    """
    if not isinstance(task, dict):
        raise ConfigError(f"a task must be a dict with 'id', 'question', 'ground_truth', got {type(task).__name__}")
    try:
        model = WorkspaceTask if task.get("workspace") is not None else Task
        return model.model_validate(task).model_dump(exclude_unset=True)
    except ValidationError as exc:
        field, value, msg = _first_error(exc)
        shown = "" if value is None else f" ({value!r})"
        raise ConfigError(f"invalid task field {field!r}{shown}: {msg}") from exc


def checked_task(idx: int, task: Any) -> dict[str, Any] | StepTrajectory:
    """`validate_task(task)`, or, for a bad task, the failed `invalid_task` trajectory that stands for it."""
    try:
        return validate_task(task)
    except ConfigError as exc:
        task_id = task.get("id") if isinstance(task, dict) else None
        logger.warning("task %s (sample %d) rejected: %s", "without id" if task_id is None else repr(task_id), idx, exc)
        return failed_trajectory(idx, task, TerminationReason.INVALID_TASK, str(exc))


def failed_trajectory(idx: int, task: Any, reason: TerminationReason, error: str) -> StepTrajectory:
    """An empty trajectory with `failed=True`: what a task that could not run (or broke) ends as."""
    return StepTrajectory(
        prompt_tokens=[],
        response_tokens=[],
        response_masks=[],
        idx=idx,
        termination_reason=reason,
        failed=True,
        error=error,
        task=task,
    )
