"""Tools the model can call."""

from agentic_rl.tools.base import StatefulTool, Tool
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.tools.sandbox import SandboxTool
from agentic_rl.tools.search import LocalSearchTool, SerpApiSearchTool, SerperSearchTool, bm25_recall_at_k
from agentic_rl.tools.visit import LocalVisitTool, VisitTool

__all__ = [
    "CalculatorTool",
    "LocalSearchTool",
    "LocalVisitTool",
    "SandboxTool",
    "SerpApiSearchTool",
    "SerperSearchTool",
    "StatefulTool",
    "Tool",
    "VisitTool",
    "bm25_recall_at_k",
]
