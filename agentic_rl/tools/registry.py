"""Tools by name, for command lines and config files: a built-in name, a `Tool` class of your own named
`package.module:Class` (with keyword arguments: a `PluginRef`), or an MCP server (`{"mcp": {...}}`, every tool it
offers: `agentic_rl.tools.mcp`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.plugins import PluginRef
from agentic_rl.tools.base import Tool
from agentic_rl.tools.mcp import MCPToolsEntry

__all__ = ["TOOL_NAMES", "build_tools"]

#: Names `build_tools` knows, in the order the command line lists them.
TOOL_NAMES = ("calculator", "search", "visit", "web_search", "web_visit")


def build_tools(
    names: Sequence[str | PluginRef | MCPToolsEntry | dict[str, Any]], *, corpus: str | os.PathLike[str] | None = None
) -> list[Tool]:
    """One new tool instance per entry of `names` (an MCP server's entry: one per tool it offers).

    Args:
        names: in the order the model should see them, each a built-in name (`TOOL_NAMES`), a
            `package.module:Class` naming a `Tool` (or `StatefulTool`) subclass built without arguments, or a
            `PluginRef` (class and keyword arguments), or an MCP server (`MCPToolsEntry`, or its dict
            `{"mcp": {...}}`): its tools are listed now (the server started and asked), in its order.
        corpus: `{id, title, text}` JSON Lines file of the local `search` and `visit` tools (default: the shared
            HotpotQA corpus, `DEFAULT_CORPUS_PATH`).

    Raises:
        ConfigError: naming every unknown name and the known ones; for a class of your own, naming the entry and
            what is missing (module, attribute, not a `Tool` subclass, a constructor that raised); for an MCP
            server, one that does not start (naming its command and stderr) or lacks a tool named.
    """
    if any(_is_mcp(entry) for entry in names):
        return _with_mcp(names, corpus=corpus)
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
    refs = {i: _plugin(entry) for i, entry in enumerate(names) if not (isinstance(entry, str) and entry in factories)}
    unknown = [str(names[i]) for i, ref in refs.items() if ref is None]
    if unknown:
        raise ConfigError(
            f"unknown tool(s): {', '.join(unknown)}; available: {', '.join(TOOL_NAMES)}, "
            "or a Tool class as 'package.module:Class'"
        )
    return [
        factories[entry]() if i not in refs else refs[i].build(what=f"tools[{i}]", base=Tool)  # type: ignore[union-attr]
        for i, entry in enumerate(names)
    ]


def _plugin(entry: str | PluginRef) -> PluginRef | None:
    """The class reference an entry names (None: an unknown built-in name)."""
    if isinstance(entry, PluginRef):
        return entry
    return PluginRef.model_validate(entry) if isinstance(entry, str) and ":" in entry else None


def _is_mcp(entry: Any) -> bool:
    return isinstance(entry, MCPToolsEntry) or (isinstance(entry, dict) and "mcp" in entry)


def _with_mcp(names: Sequence[Any], *, corpus: str | os.PathLike[str] | None) -> list[Tool]:
    """`build_tools` over entries some of which name MCP servers: in order; what was started is closed on a failure."""
    from agentic_rl.tools.mcp import MCPTool, build_mcp_tools

    tools: list[Tool] = []
    try:
        for entry in names:
            tools.extend(build_mcp_tools(entry) if _is_mcp(entry) else build_tools([entry], corpus=corpus))
    except BaseException:
        for tool in tools:
            if isinstance(tool, MCPTool):
                tool.connection.close()
        raise
    return tools
