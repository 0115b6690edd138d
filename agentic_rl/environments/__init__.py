"""Environments: the reset/step/close contract and the tool-calling environment."""

from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import ToolEnvironment

__all__ = ["Environment", "Sample", "StepResult", "ToolEnvironment"]
