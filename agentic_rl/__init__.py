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


class _TrainEntry:
    """`agentic_rl.train`: called, the training entry point (`agentic_rl.loop.train`, a coroutine function); read as
    a package, the learner subpackage `agentic_rl.train` (its names and submodules, e.g. `agentic_rl.train.loss`).
    Both share one name, so imports of the subpackage (`import agentic_rl.train.loss as m`) keep working."""

    def __call__(self, *args: object, **kwargs: object) -> object:
        from agentic_rl.loop import train

        return train(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(importlib.import_module("agentic_rl.train"), name)

    def __repr__(self) -> str:
        return "<agentic_rl.train: the training entry point (agentic_rl.loop.train) and the learner subpackage>"


class _Package(type(sys)):
    """The package's module: `agentic_rl.train` stays the `_TrainEntry` after the import system binds the learner
    subpackage on its parent (the subpackage itself stays in `sys.modules["agentic_rl.train"]`)."""

    @property
    def train(self) -> _TrainEntry:
        return _TRAIN

    @train.setter
    def train(self, value: object) -> None:
        if not isinstance(value, type(sys)):
            raise AttributeError("agentic_rl.train is the training entry point (agentic_rl.loop.train)")


_TRAIN = _TrainEntry()
sys.modules[__name__].__class__ = _Package
logging.getLogger(__name__).addHandler(logging.NullHandler())
