"""Tools the model can call."""

from agentic_rl.tools.base import StatefulTool, Tool
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.tools.sandbox import SandboxTool
from agentic_rl.tools.search import LocalSearchTool, SerpApiSearchTool, SerperSearchTool, bm25_recall_at_k
from agentic_rl.tools.visit import LocalVisitTool, VisitTool
from agentic_rl.tools.workspace import Workspaces, sweep_stale_workspaces
from agentic_rl.tools.workspace_config import WorkspaceConfig
from agentic_rl.tools.workspace_tools import BashTool, CreateTool, InsertTool, StrReplaceTool, ViewTool

__all__ = [
    "BashTool",
    "CalculatorTool",
    "CreateTool",
    "InsertTool",
    "LocalSearchTool",
    "LocalVisitTool",
    "SandboxTool",
    "SerpApiSearchTool",
    "SerperSearchTool",
    "StatefulTool",
    "StrReplaceTool",
    "Tool",
    "ViewTool",
    "VisitTool",
    "WorkspaceConfig",
    "Workspaces",
    "bm25_recall_at_k",
    "sweep_stale_workspaces",
]
