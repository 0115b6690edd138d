"""Tools the model can call."""

from agentic_rl.tools.base import StatefulTool, Tool
from agentic_rl.tools.calculator import CalculatorTool

__all__ = ["CalculatorTool", "StatefulTool", "Tool"]
