"""agentic_rl: an async, single-process agentic-RL rollout engine on colocated, in-process vLLM engines.

The training entry points (`train`, `run_training`, `TrainConfig`, `GRPOConfig`, `run_sft`, `SFTConfig`, from
`agentic_rl.loop`) are loaded on first use: they bring the trainer, which `import agentic_rl` does not load.
"""

import importlib
import logging
import sys

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
from agentic_rl.rewards.answers import final_answer_text
from agentic_rl.rewards.math import gsm8k_reward
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
    "GRPOConfig",
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
    "SFTConfig",
    "Sample",
    "SamplingConfig",
    "StatefulTool",
    "Step",
    "StepResult",
    "StepTrajectory",
    "SuspendedRollout",
    "TemplateError",
    "TerminationReason",
    "TrainConfig",
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
    "run_sft",
    "run_tasks",
    "run_training",
    "run_trajectory",
    "train",
]

# name -> the module it is loaded from on first use
_LAZY = {name: "agentic_rl.loop" for name in ("GRPOConfig", "SFTConfig", "TrainConfig", "run_sft", "run_training")}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "train"})


class _Package(type(sys)):
    """The package's module: `agentic_rl.train` names the training entry point, which shares its name with the
    trainer's subpackage. The import system binds a subpackage on its parent when it first loads it; that binding is
    kept off the name (the subpackage stays in `sys.modules["agentic_rl.train"]`, where imports find it)."""

    @property
    def train(self) -> object:
        from agentic_rl.loop import train

        return train

    @train.setter
    def train(self, value: object) -> None:
        if not isinstance(value, type(sys)):
            raise AttributeError("agentic_rl.train is the training entry point (agentic_rl.loop.train)")


sys.modules[__name__].__class__ = _Package
logging.getLogger(__name__).addHandler(logging.NullHandler())
