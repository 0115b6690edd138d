"""Tools by name, for command lines and config files."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.tools.base import Tool

__all__ = ["TOOL_NAMES", "build_tools"]

#: Names `build_tools` knows, in the order the command line lists them.
TOOL_NAMES = ("calculator", "search", "visit", "web_search", "web_visit")


def build_tools(names: Sequence[str], *, corpus: str | os.PathLike[str] | None = None) -> list[Tool]:
    """One new tool instance per name in `names` (see `TOOL_NAMES`).

    Args:
        names: tool names, in the order the model should see them.
        corpus: `{id, title, text}` JSON Lines file of the local `search` and `visit` tools (default: the shared
            HotpotQA corpus, `DEFAULT_CORPUS_PATH`).

    Raises:
        ConfigError: naming every unknown name and the known ones.
    """
    from agentic_rl.tools.calculator import CalculatorTool
    from agentic_rl.tools.search import DEFAULT_CORPUS_PATH, LocalSearchTool, SerperSearchTool
    from agentic_rl.tools.visit import LocalVisitTool, VisitTool

    path = DEFAULT_CORPUS_PATH if corpus is None else corpus
    factories: dict[str, Callable[[], Any]] = {
        "calculator": CalculatorTool,
        "search": lambda: LocalSearchTool(path),
        "visit": lambda: LocalVisitTool(path),
        "web_search": SerperSearchTool,
        "web_visit": VisitTool,
    }
    unknown = [name for name in names if name not in factories]
    if unknown:
        raise ConfigError(f"unknown tool(s): {', '.join(unknown)}; available: {', '.join(TOOL_NAMES)}")
    return [factories[name]() for name in names]
