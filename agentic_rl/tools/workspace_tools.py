"""The tools of a coding agent over one shared workspace per trajectory: ``bash``, ``view``, ``create``,
``str_replace`` and ``insert``.

Each is a `StatefulTool` over one `Workspaces`: `session_start` holds the trajectory's workspace (starting it on
first use) and `session_end` lets it go, the last one removing it. A call's arguments are checked here (a mistake
comes back as `ToolError` text saying what to send instead), then run inside the workspace's sandbox
(`workspace_ops`). Build them together with `workspace_tools`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import anyio

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.base import StatefulTool
from agentic_rl.tools.workspace import Workspaces

__all__ = [
    "WORKSPACE_TOOL_NAMES",
    "BashTool",
    "CreateTool",
    "InsertTool",
    "StrReplaceTool",
    "ViewTool",
    "WorkspaceTool",
    "workspace_tools",
]

_GRACE_S = 15.0  # beyond a call's own limit: the interpreter's start and reply


def _text(arguments: dict[str, Any], name: str, *, required: bool = True, empty: bool = True) -> str:
    value = arguments.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ToolError(f"the '{name}' argument is required and must be a string")
    if not empty and not value:
        raise ToolError(f"the '{name}' argument must not be empty")
    return value


def _integer(arguments: dict[str, Any], name: str) -> int:
    value = arguments.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolError(f"the '{name}' argument is required and must be an integer, got {value!r}")
    return value


def _clean(text: str) -> str:
    """`text` without lone surrogates (a file name that is not UTF-8): they become U+FFFD."""
    return text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text


class WorkspaceTool(StatefulTool):
    """A tool over the trajectory's workspace in `workspaces`; subclasses set the schema, `check` and `timeout_s`.

    Args:
        workspaces: the manager every tool of the environment shares.
    """

    op: ClassVar[str] = ""

    def __init__(self, workspaces: Workspaces) -> None:
        self.workspaces = workspaces

    @property
    def timeout_s(self) -> float:  # type: ignore[override]
        return self.workspaces.config.op_timeout_s

    @property
    def call_timeout_s(self) -> float:
        """The environment's bound on one call: the tool's limit, an interpreter start and a grace."""
        return self.timeout_s + self.workspaces.config.startup_timeout_s + 2 * _GRACE_S

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments as `workspace_ops` takes them. Raises `ToolError` naming what is wrong."""
        return {"path": _text(arguments, "path", empty=False)}

    def session_start(self, session_id: str) -> None:
        self.workspaces.acquire(session_id, self.name)

    def session_end(self, session_id: str) -> None:
        self.workspaces.release(session_id, self.name)

    def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        """Runs the call in the trajectory's workspace.

        Raises:
            ToolError: for bad arguments or a failed call, saying what to do; `ToolUnavailableError` when the
                workspace's sandbox cannot start or answer.
        """
        if not isinstance(arguments, dict):
            raise ToolError(f"{self.name} takes a JSON object of arguments")
        known = self.parameters["properties"]
        unknown = ", ".join(repr(name) for name in arguments if name not in known)
        extra = f"unknown argument(s) {unknown}: {self.name} takes {', '.join(known)}" if unknown else ""
        try:
            args = self.check(arguments)
        except ToolError as exc:  # a misnamed argument is often why one is missing: name both
            if extra:
                raise ToolError(f"{exc}; {extra}") from None
            raise
        if extra:  # the schema allows no others: an argument the tool would ignore is refused, not dropped
            raise ToolError(extra)
        args["max_output_bytes"] = self.workspaces.config.max_output_bytes
        result = self.workspaces.call(session_id, self.op, args, timeout_s=self._limit(args) + _GRACE_S)
        return _clean(str(result))

    def _limit(self, args: dict[str, Any]) -> float:
        return self.timeout_s

    async def aclose(self) -> None:
        """Removes every workspace of the shared manager (each tool's `aclose` does; the first one works)."""
        await anyio.to_thread.run_sync(self.workspaces.close)


class BashTool(WorkspaceTool):
    """``bash``: a shell command in the workspace, its working directory and exported variables kept between calls."""

    name = "bash"
    op = "bash"
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command (or script) to run."},
            "timeout_s": {"type": "number", "description": "Seconds before the command is killed (optional)."},
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def __init__(self, workspaces: Workspaces) -> None:
        super().__init__(workspaces)
        config = workspaces.config
        self.description = (
            "Run a bash command in the workspace, which starts in the code base's root folder. The working "
            "directory and exported variables persist between calls (a `cd` or an `export` holds). Returns stdout "
            "and stderr together (the first and last bytes of longer output, "
            f"{config.max_output_bytes} bytes in all) and the exit code. A command still running after timeout_s "
            f"seconds (default {config.bash_timeout_s:g}, at most {config.bash_max_timeout_s:g}) is killed. There is "
            "no network access."
        )

    @property
    def timeout_s(self) -> float:  # type: ignore[override]
        return self.workspaces.config.bash_max_timeout_s

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        config = self.workspaces.config
        command = _text(arguments, "command", empty=False)
        timeout_s = arguments.get("timeout_s")
        timeout_s = config.bash_timeout_s if timeout_s is None else timeout_s  # null: not given (OpenAI strict mode)
        valid = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
        if not valid or not 0 < timeout_s <= config.bash_max_timeout_s:
            raise ToolError(
                f"timeout_s must be a number of seconds above 0 and at most {config.bash_max_timeout_s:g}, "
                f"got {timeout_s!r}"
            )
        return {"command": command, "timeout_s": float(timeout_s)}

    def _limit(self, args: dict[str, Any]) -> float:
        return args["timeout_s"]


class ViewTool(WorkspaceTool):
    """``view``: a file with line numbers (or a range of its lines), or a directory's entries."""

    name = "view"
    op = "view"
    description = (
        "View a file of the workspace with line numbers: all of it, or view_range [start, end] of its lines "
        "(1-based, inclusive; end -1 means the last line). A directory lists its entries two levels deep. Paths are "
        "relative to the workspace root (not to bash's working directory)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File or directory path, relative to the workspace root."},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
                "description": "Optional [start, end] line range of a file.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        args = super().check(arguments)
        view_range = arguments.get("view_range")
        if view_range is not None:
            ok = isinstance(view_range, list) and len(view_range) == 2
            if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range):
                raise ToolError(f"view_range must be two line numbers [start, end], got {view_range!r}")
            args["view_range"] = view_range
        return args


class CreateTool(WorkspaceTool):
    """``create``: a new file with the given text."""

    name = "create"
    op = "create"
    description = (
        "Create a file in the workspace with the given text; missing parent folders are created. An existing file "
        "is only replaced when overwrite is true (to change part of a file, use str_replace or insert)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "file_text": {"type": "string", "description": "The whole content of the file."},
            "overwrite": {"type": "boolean", "description": "Replace the file if it exists (default false)."},
        },
        "required": ["path", "file_text"],
        "additionalProperties": False,
    }

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        args = super().check(arguments)
        args["file_text"] = _text(arguments, "file_text")
        overwrite = arguments.get("overwrite")
        overwrite = False if overwrite is None else overwrite
        if not isinstance(overwrite, bool):
            raise ToolError(f"overwrite must be true or false, got {overwrite!r}")
        args["overwrite"] = overwrite
        return args


class StrReplaceTool(WorkspaceTool):
    """``str_replace``: one exact occurrence of a text replaced."""

    name = "str_replace"
    op = "str_replace"
    description = (
        "Replace text in a file of the workspace: old_str must occur exactly once in the file, matching it exactly "
        "(whitespace and indentation included); it is replaced by new_str (empty or left out: deleted). Include "
        "enough surrounding lines in old_str to make it unique."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "old_str": {"type": "string", "description": "The exact text to replace."},
            "new_str": {"type": "string", "description": "The text to put in its place."},
        },
        "required": ["path", "old_str"],
        "additionalProperties": False,
    }

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        args = super().check(arguments)
        args["old_str"] = _text(arguments, "old_str", empty=False)
        args["new_str"] = _text(arguments, "new_str", required=False)
        return args


class InsertTool(WorkspaceTool):
    """``insert``: lines inserted after a given line."""

    name = "insert"
    op = "insert"
    description = "Insert text into a file of the workspace as new lines after line insert_line (0 inserts at the top)."
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "insert_line": {"type": "integer", "description": "The line after which to insert (0: the top)."},
            "new_str": {"type": "string", "description": "The text to insert."},
        },
        "required": ["path", "insert_line", "new_str"],
        "additionalProperties": False,
    }

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        args = super().check(arguments)
        args["insert_line"] = _integer(arguments, "insert_line")
        args["new_str"] = _text(arguments, "new_str")
        return args


_TOOLS: dict[str, type[WorkspaceTool]] = {
    cls.name: cls for cls in (BashTool, ViewTool, CreateTool, StrReplaceTool, InsertTool)
}
WORKSPACE_TOOL_NAMES = tuple(_TOOLS)
"""The workspace tools' names, in the order the model sees them."""


def workspace_tools(workspaces: Workspaces, names: Sequence[str] = WORKSPACE_TOOL_NAMES) -> list[WorkspaceTool]:
    """One tool per name in `names`, all over `workspaces`.

    Raises:
        ConfigError: for an unknown or repeated name.
    """
    unknown = [name for name in names if name not in _TOOLS]
    if unknown or len(set(names)) != len(names):
        raise ConfigError(f"workspace_tools must be distinct names among {', '.join(_TOOLS)}; got {list(names)}")
    return [_TOOLS[name](workspaces) for name in names]
