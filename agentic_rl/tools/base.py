"""Tools the model can call: a JSON function schema plus `execute(arguments) -> str`, and observation capping."""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["MIN_MAX_CHARS", "StatefulTool", "Tool", "cap_text"]

#: The smallest observation limit (`max_chars`) a tool accepts: room for some text and `cap_text`'s marker.
MIN_MAX_CHARS = 200


def cap_text(text: str, max_chars: int) -> str:
    """Cut `text` to at most `max_chars` characters, ending with a `...[truncated N characters]` marker.

    Args:
        text: the text to cap.
        max_chars: the most characters of the result, marker included (must exceed the marker's ~40 characters).

    Returns:
        `text` itself when it fits, else its start plus the marker; never longer than `max_chars`.
    """
    if len(text) <= max_chars:
        return text
    # The marker counts at most len(text) characters, so its length with len(text) is an upper bound.
    keep = max(0, max_chars - len(f"\n...[truncated {len(text)} characters]"))
    return text[:keep] + f"\n...[truncated {len(text) - keep} characters]"


class Tool(abc.ABC):
    """A stateless tool.

    Subclasses set `name`, `description` and `parameters` (a JSON Schema object) and implement `execute`, either as
    a plain function (run in a worker thread, off the event loop) or as a coroutine function.

    Attributes:
        timeout_s: wall-clock limit of one call in seconds; past it the model gets an error observation.
        call_timeout_s: the bound the environment puts on one call (and on `aclose`), in seconds: `timeout_s`
            unless the tool needs more around its own limit (the sandbox adds its interpreter start-up).
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    timeout_s: float = 10.0

    @property
    def call_timeout_s(self) -> float:
        return self.timeout_s

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: `{"type": "function", "function": {name, description, parameters}}`."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def aclose(self) -> None:  # noqa: B027  (optional hook)
        """Release what the tool holds across calls (HTTP clients, pools). Called once when its owner closes; must
        not raise. The default holds nothing."""

    @abc.abstractmethod
    def execute(self, arguments: dict[str, Any]) -> str:
        """Run the tool on already-parsed `arguments`.

        Returns:
            The observation text for the model.

        Raises:
            ToolError: for a failure the call caused (bad arguments, a query with no result): the model reads the
                message and the trajectory goes on.
            ToolUnavailableError: for a failure of the tool's service, not the call (transport error, timeout,
                start-up): the model reads the message, and the trajectory ends as an infrastructure failure
                (retried, never trained). Any other exception, and a call past `call_timeout_s`, counts as this too:
                a tool wraps the errors its input can cause in `ToolError`.
        """


class StatefulTool(Tool):
    """A tool that keeps state per session (one session per trajectory).

    The environment calls `session_start(session_id)` before the first call of a trajectory,
    `execute_session(session_id, arguments)` for each call and `session_end(session_id)` when the trajectory
    closes. Each may be a plain or a coroutine function.
    """

    def execute(self, arguments: dict[str, Any]) -> str:
        raise TypeError(f"{type(self).__name__} is stateful: call execute_session(session_id, arguments)")

    @abc.abstractmethod
    def session_start(self, session_id: str) -> None:
        """Create the state of one session."""

    @abc.abstractmethod
    def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        """Run one call inside a session; returns the observation text."""

    @abc.abstractmethod
    def session_end(self, session_id: str) -> None:
        """Free the state of one session. Must be idempotent."""
