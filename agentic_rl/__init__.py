"""agentic_rl: an async, single-process agentic-RL rollout engine on colocated, in-process vLLM engines."""

import logging

from agentic_rl.chat import AlignmentReport, ChatRenderer, check_alignment
from agentic_rl.config import Config
from agentic_rl.engine.base import Engine, Generation, PausableEngine, TrainableEngine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Environment, Sample, StepResult
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import (
    AgenticRLError,
    ConfigError,
    EngineAbortedError,
    EngineError,
    EngineRejectedError,
    EngineTimeoutError,
    EnvStepError,
    ModelError,
    RequestError,
    RewardError,
    TemplateError,
    ToolError,
    TrainingError,
    TrajectoryError,
)
from agentic_rl.models import DEFAULT_MODEL, resolve_model
from agentic_rl.parser import ToolCall, ToolCallError, parse_tool_calls
from agentic_rl.rewards.functions import final_answer_text, gsm8k_reward
from agentic_rl.rollout.harness import TrajectoryCheckpoint, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.session import Rollout, RolloutResult, SuspendedRollout
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec
from agentic_rl.rollout.wrapper import BaseEngineWrapper, ToolAgentEngineWrapper
from agentic_rl.tools.base import StatefulTool, Tool
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.types import RunRecorder, Step, StepTrajectory, TerminationReason, TokenRun, Trajectory

__all__ = [
    "DEFAULT_MODEL",
    "AgenticRLError",
    "AlignmentReport",
    "BaseEngineWrapper",
    "CalculatorTool",
    "ChatRenderer",
    "Config",
    "ConfigError",
    "Engine",
    "EngineAbortedError",
    "EngineError",
    "EngineRejectedError",
    "EngineTimeoutError",
    "EnvStepError",
    "Environment",
    "Generation",
    "HarnessConfig",
    "ModelError",
    "RequestError",
    "RewardError",
    "Rollout",
    "RolloutResult",
    "RolloutSpec",
    "RunRecorder",
    "Sample",
    "SamplingConfig",
    "StatefulTool",
    "Step",
    "StepResult",
    "StepTrajectory",
    "SuspendedRollout",
    "TemplateError",
    "TerminationReason",
    "TokenRun",
    "Tool",
    "ToolAgentEngineWrapper",
    "ToolCall",
    "ToolCallError",
    "ToolEnvironment",
    "ToolError",
    "PausableEngine",
    "TrainableEngine",
    "TrainingError",
    "Trajectory",
    "TrajectoryCheckpoint",
    "TrajectoryError",
    "check_alignment",
    "final_answer_text",
    "gsm8k_reward",
    "parse_tool_calls",
    "resolve_model",
    "run_tasks",
    "run_trajectory",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
