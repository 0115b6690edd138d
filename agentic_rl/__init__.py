"""agentic_rl: an async, single-process agentic-RL rollout engine on colocated, in-process vLLM engines.

Every name is loaded on first use (`from agentic_rl import Trajectory` loads `agentic_rl.types`): `import agentic_rl`
loads neither torch nor vLLM.
"""

import importlib
import logging
import sys

from agentic_rl.lazy import lazy_exports as _lazy_exports

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
    "FailureKind",
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
    "ToolUnavailableError",
    "PausableEngine",
    "TrainableEngine",
    "TrainingError",
    "Trajectory",
    "TrajectoryCheckpoint",
    "TrajectoryError",
    "WorkspaceConfig",
    "WorkspaceEnvironment",
    "Workspaces",
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

# name -> the module it is loaded from on first use: `import agentic_rl` loads no torch, so that commands that
# need none (`agentic-rl plan`) start at once
_LAZY = {
    **dict.fromkeys(("AlignmentReport", "ChatRenderer", "check_alignment"), "agentic_rl.chat"),
    **dict.fromkeys(("Config",), "agentic_rl.config"),
    **dict.fromkeys(("Engine", "Generation", "PausableEngine", "TrainableEngine"), "agentic_rl.engine.base"),
    **dict.fromkeys(("SamplingConfig",), "agentic_rl.engine.sampling"),
    **dict.fromkeys(("Environment", "Sample", "StepResult"), "agentic_rl.environments.base"),
    **dict.fromkeys(("ToolEnvironment",), "agentic_rl.environments.tool_env"),
    **dict.fromkeys(("WorkspaceEnvironment",), "agentic_rl.environments.workspace"),
    **dict.fromkeys(
        (
            "AgenticRLError",
            "ConfigError",
            "EngineAbortedError",
            "EngineError",
            "EngineRejectedError",
            "EngineTimeoutError",
            "EnvStepError",
            "ModelError",
            "RequestError",
            "RewardError",
            "TemplateError",
            "ToolError",
            "ToolUnavailableError",
            "TrainingError",
            "TrajectoryError",
        ),
        "agentic_rl.errors",
    ),
    **dict.fromkeys(("DEFAULT_MODEL", "resolve_model"), "agentic_rl.models"),
    **dict.fromkeys(("ToolCall", "ToolCallError", "parse_tool_calls"), "agentic_rl.parser"),
    **dict.fromkeys(("final_answer_text",), "agentic_rl.rewards.answers"),
    **dict.fromkeys(("gsm8k_reward",), "agentic_rl.rewards.math"),
    **dict.fromkeys(("TrajectoryCheckpoint", "run_trajectory"), "agentic_rl.rollout.harness"),
    **dict.fromkeys(("run_tasks",), "agentic_rl.rollout.runner"),
    **dict.fromkeys(("Rollout", "RolloutResult", "SuspendedRollout"), "agentic_rl.rollout.session"),
    **dict.fromkeys(("HarnessConfig", "RolloutSpec"), "agentic_rl.rollout.spec"),
    **dict.fromkeys(("BaseEngineWrapper", "ToolAgentEngineWrapper"), "agentic_rl.rollout.wrapper"),
    **dict.fromkeys(("StatefulTool", "Tool"), "agentic_rl.tools.base"),
    **dict.fromkeys(("CalculatorTool",), "agentic_rl.tools.calculator"),
    **dict.fromkeys(("Workspaces",), "agentic_rl.tools.workspace"),
    **dict.fromkeys(("WorkspaceConfig",), "agentic_rl.tools.workspace_config"),
    **dict.fromkeys(
        ("FailureKind", "RunRecorder", "Step", "StepTrajectory", "TerminationReason", "TokenRun", "Trajectory"),
        "agentic_rl.types",
    ),
    **dict.fromkeys(("GRPOConfig", "SFTConfig", "TrainConfig", "run_sft", "run_training"), "agentic_rl.loop"),
}


__getattr__, _lazy_dir = _lazy_exports(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted({*_lazy_dir(), "train"})


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
