"""Exceptions raised by agentic_rl.

Hierarchy::

    AgenticRLError
    ├── ConfigError (also ValueError)      a parameter, task or config value is out of range or of the wrong type
    ├── TrajectoryError (also ValueError)  a trajectory record is inconsistent (lengths, NaN/Inf values)
    ├── ModelError                          a model name cannot be resolved into a local Hugging Face folder
    ├── TemplateError                       a chat template cannot be used for exact token bookkeeping
    ├── EngineError                         the inference engine failed, or was used before start / after close
    │   ├── EngineTimeoutError              one generate call did not return within the per-turn limit
    │   ├── EngineAbortedError              the engine ended a request without a turn (finish_reason `abort`)
    │   └── EngineRejectedError             the engine refused one request (bad sampling options, prompt too long)
    ├── ToolError                           a tool failed while executing (turned into error text for the model)
    │   └── ToolUnavailableError            the tool's service failed, not the call (transport, timeout, start-up)
    ├── EnvStepError                        an environment's reset/step failed (fails that trajectory only)
    │   └── EnvTimeoutError                 a reset/step did not return within `env_timeout_s`
    ├── RewardError                         a reward function failed or returned a non-finite value
    ├── TrainingError                       training cannot go on (e.g. optimizer steps skipped too often in a row)
    └── RequestError (also ValueError)      the OpenAI-compatible server refuses a request (`status` 400/404/413)

A `ConfigError` (and a `ModelError`) is the caller's input: the command line exits with 2 for them. The others
happen while running: the command line exits with 1.

Expected outcomes are not exceptions: a malformed tool call is error text for the model, a full context window
is a termination reason of the trajectory.
"""

from __future__ import annotations

__all__ = [
    "AgenticRLError",
    "ConfigError",
    "EngineAbortedError",
    "EngineError",
    "EngineRejectedError",
    "EngineTimeoutError",
    "EnvStepError",
    "EnvTimeoutError",
    "ModelError",
    "RequestError",
    "RewardError",
    "TemplateError",
    "ToolError",
    "ToolUnavailableError",
    "TrainingError",
    "TrajectoryError",
]


class AgenticRLError(Exception):
    """Root of every exception raised on purpose by agentic_rl."""


class ConfigError(AgenticRLError, ValueError):
    """Raised when a parameter, task or config value is out of range or of the wrong type.

    Attributes:
        path: for a bad field of a settings object, `[ClassName, field, subfield, ...]`; else empty.
        detail: the message after the path (e.g. ` is not a known field`); else the whole message.
    """

    def __init__(self, message: str, *, path: list[str] | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.path: list[str] = list(path or [])
        self.detail: str = message if detail is None else detail


class TrajectoryError(AgenticRLError, ValueError):
    """Raised when a trajectory record is inconsistent: mismatched lengths, NaN or Inf values."""


class ModelError(AgenticRLError):
    """Raised when a model name or path cannot be turned into a local Hugging Face folder."""


class TemplateError(AgenticRLError):
    """Raised when a chat template renders in a way exact token bookkeeping cannot follow."""


class EngineError(AgenticRLError):
    """Raised when the inference engine fails, or is used before `start()` or after `close()`."""


class EngineTimeoutError(EngineError):
    """Raised when one engine request did not return within `HarnessConfig.turn_timeout_s` (it is aborted)."""


class EngineAbortedError(EngineError):
    """Raised when the engine ended a request as aborted (or with an error) instead of a turn; it is never trained."""


class EngineRejectedError(EngineError):
    """Raised by `generate` / `stream` when the engine refuses one request (e.g. sampling options it cannot honour);
    the other requests go on."""


class ToolError(AgenticRLError):
    """Raised inside a tool when it cannot complete; the environment turns it into error text."""


class ToolUnavailableError(ToolError):
    """Raised inside a tool when its service failed rather than the call: a transport error or timeout after the
    tool's own retries, a server that died or could not start, a sandbox that could not start, a malformed reply.

    An infrastructure failure (`types.FailureKind.TOOL`): the model still reads the error text, but the trajectory
    ends failed and is rolled out again with a fresh sample (`HarnessConfig.max_retries`); it is never trained on, so
    a failing tool never becomes a reward of 0 for the policy."""


class EnvStepError(AgenticRLError):
    """Raised when an environment's `reset` or `step` fails; only that trajectory fails."""


class EnvTimeoutError(EnvStepError):
    """Raised when an environment's `reset` or `step` did not return within `HarnessConfig.env_timeout_s` (it is
    cancelled); only that trajectory fails, with termination reason `timeout`."""


class RewardError(AgenticRLError):
    """Raised when a reward function fails or returns a non-finite value."""


class TrainingError(AgenticRLError):
    """Raised when training cannot go on: e.g. `GRPOConfig.max_consecutive_skips` optimizer steps in a row were
    skipped for a non-finite gradient norm."""


class RequestError(AgenticRLError, ValueError):
    """Raised when the OpenAI-compatible server refuses a request; the server answers with OpenAI's error body.

    Attributes:
        status: the HTTP status (400 bad input, 404 unknown model or trajectory, 413 body too large).
        param: the offending request field, or None.
        kind: OpenAI's error `type` (`invalid_request_error`, `not_found_error`).
    """

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind
