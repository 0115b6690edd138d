"""Environments: the reset/step/close contract, the tool-calling environment and the coding-workspace one."""

from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import ToolEnvironment, ToolReply
from agentic_rl.environments.workspace import WorkspaceEnvironment

__all__ = ["Environment", "Sample", "StepResult", "ToolEnvironment", "ToolReply", "WorkspaceEnvironment"]
