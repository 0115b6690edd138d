"""What a training run rolls out with: the built-in tool agent, a user's environment or tools under the harness, or
a user's `BaseEngineWrapper` subclass, behind one interface (`TrainingRollout`), and the gate every record passes
before it is trained (`refuse_untrainable`).

The training loop builds one with `build_training_rollout` from its config; everything a run samples goes through
its engine wrapped in a `RecordingEngine`, so that the gate can check each record's sampled tokens against what the
engine sampled.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine
from agentic_rl.engine.ledger import RecordingEngine, SampleLedger
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Environment
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.plugins import PluginRef
from agentic_rl.rollout.bounded import close_quietly
from agentic_rl.rollout.contracts import (
    check_agent,
    check_constructor,
    check_environment,
    check_tool,
    check_tools,
)
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.rollout.tasks import failed_trajectory
from agentic_rl.rollout.wrapper import BaseEngineWrapper, collect_trajectories
from agentic_rl.train.groups import TrajectoryGroup
from agentic_rl.types import TerminationReason, Trajectory

__all__ = [
    "AgentRollout",
    "SpecRollout",
    "TrainingRollout",
    "build_environment",
    "build_training_rollout",
    "load_classes",
    "refuse",
    "refuse_untrainable",
]

logger = logging.getLogger(__name__)

#: Most seconds a user agent's `close` may take at the end of a run (then it is logged and left).
AGENT_CLOSE_TIMEOUT_S = 30.0

_AGENT_SETTINGS = (
    "agent_name",
    "tokenizer",
    "sampling_params",
    "max_prompt_length",
    "max_response_length",
    "n_parallel_agents",
    "max_steps",
)
"""The keyword arguments a run builds a user's agent with (`_build_agent`), besides its config's `agent.kwargs`."""


class TrainingRollout(Protocol):
    """Tasks in, one trajectory per task out (in task order), sampled with the given options."""

    ledger: SampleLedger  # what the engine sampled for this rollout source
    whole_batches: bool  # `run` must get a whole batch per call (calls do not overlap): see `ContinuousRollout`

    async def run(
        self,
        tasks: Sequence[dict[str, Any]],
        sampling: SamplingConfig,
        *,
        indices: Sequence[int] | None = None,
        on_result: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """One trajectory per task, in task order; `indices` are the tasks' positions in their batch (which offset
        their sampling seeds; default 0, 1, ...); `on_result` is called with each trajectory as it is done."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class SpecRollout:
    """The harness's turn loop over a `RolloutSpec` (the built-in tool agent, or a user's environment and tools)."""

    spec: RolloutSpec
    n_parallel_agents: int
    ledger: SampleLedger
    whole_batches: bool = False

    async def run(
        self,
        tasks: Sequence[dict[str, Any]],
        sampling: SamplingConfig,
        *,
        indices: Sequence[int] | None = None,
        on_result: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        from agentic_rl.rollout.session import Rollout

        rollout = Rollout(self.spec.with_sampling(sampling), n_parallel_agents=self.n_parallel_agents)
        return list((await rollout.run(list(tasks), indices=indices, on_result=on_result)).trajectories)

    async def aclose(self) -> None:
        """The environment's `aclose`, bounded by `close_timeout_s`, a failure logged, never raised."""
        await close_quietly(self.spec.environment.aclose, self.spec.config.close_timeout_s)


@dataclass
class AgentRollout:
    """A user's `BaseEngineWrapper` subclass: its `generate_agent_trajectories_async`, on the run's engine."""

    agent: BaseEngineWrapper
    ledger: SampleLedger
    whole_batches: bool = True  # the agent's sampling options are its own state: one call at a time
    _lock: anyio.Lock = field(default_factory=anyio.Lock, init=False)

    async def run(
        self,
        tasks: Sequence[dict[str, Any]],
        sampling: SamplingConfig,
        *,
        indices: Sequence[int] | None = None,
        on_result: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """The agent's trajectories of `tasks`, in task order; one call at a time, each with its own sampling options
        (`indices` is not used: the agent seeds its own requests from the options it is given; `on_result` gets
        them all once the agent returns).

        Raises:
            TrainingError: if the agent raised or returned a list of another length (the trajectories could not be
                matched to their tasks).
        """
        name = type(self.agent).__name__
        try:
            async with self._lock:
                self.agent.set_sampling(sampling.model_dump(exclude_none=True))
                out = await collect_trajectories(self.agent, tasks)
        except Exception as exc:
            raise TrainingError(f"agent {name} failed to roll out {len(tasks)} tasks: {_describe(exc)}") from exc
        if len(out) != len(tasks):
            raise TrainingError(
                f"agent {name} returned {len(out)} trajectories for {len(tasks)} tasks; it must return "
                "one per task, in task order"
            )
        for i, t in enumerate(out):  # something that is not a trajectory is a refused record of its task
            if not isinstance(t, Trajectory):
                reason = f"{name} returned {type(t).__name__}, not a Trajectory"
                out[i] = failed_trajectory(i, tasks[i], TerminationReason.ERROR, f"refused for training: {reason}")
                refuse(out[i], reason)
        for t in out if on_result is not None else ():
            on_result(t)
        return out

    async def aclose(self) -> None:
        """The agent's `close`, bounded by `AGENT_CLOSE_TIMEOUT_S`, a failure logged, never raised."""
        await close_quietly(self.agent.close, AGENT_CLOSE_TIMEOUT_S)


def _describe(exc: BaseException) -> str:
    """`Type: message` of an exception; for an exception group, of the errors inside it (at most three)."""
    if isinstance(exc, BaseExceptionGroup):
        leaves: list[BaseException] = []
        pending = list(exc.exceptions)
        while pending:
            e = pending.pop(0)
            if isinstance(e, BaseExceptionGroup):
                pending[:0] = list(e.exceptions)
            else:
                leaves.append(e)
        more = f" (and {len(leaves) - 3} more)" if len(leaves) > 3 else ""
        return "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3]) + more
    return f"{type(exc).__name__}: {exc}"


def refuse(trajectory: Trajectory, reason: str) -> None:
    """Refuse `trajectory` for training, in place: `refused` holds the reason, and it fails with the reason in `error`
    (`refused for training: ...`). Packing leaves its tokens out (`exclusion_reason` "refused", counted as
    `tokens_excluded_refused`). The one writer of `Trajectory.refused`."""
    trajectory.failed = True
    trajectory.error = f"refused for training: {reason}"
    trajectory.refused = reason


def refuse_untrainable(trajectories: Sequence[Trajectory], ledger: SampleLedger) -> int:
    """Refuse (`refuse`), in place, every record whose sampled tokens are not exactly what the engine sampled: no
    logprobs, a run whose lengths disagree, a token or logprob that differs from the engine's, or a context the engine
    never sampled in (`SampleLedger.check_run`); each is logged. Failed trajectories are left as they are (they are
    not trained anyway).

    Returns:
        How many trajectories are refused: those this call refused and those refused before it (e.g. an agent's
        result that was not a `Trajectory`, see `AgentRollout.run`).
    """
    for t in trajectories:
        reason = None if t.failed else _untrainable_reason(t, ledger)
        if reason is not None:
            refuse(t, reason)
            logger.warning("trajectory %s refused for training: %s", t.idx, reason)
    return sum(t.refused is not None for t in trajectories)


def refuse_lone_samples(groups: Sequence[TrajectoryGroup]) -> int:
    """Refuse (`refuse`), in place, the one trainable sample of a group whose other samples all failed or were refused:
    GRPO weighs a sample against the others of its group, so a group of one has advantage 0 and would train nothing
    but its KL term. Failed and refused samples are left as they are.

    Returns:
        How many samples this call refused (each logged).
    """
    refused = 0
    for group in groups:
        valid = [t for t in group.samples if not t.failed]
        if len(valid) == 1 and len(group.samples) > 1:
            refuse(valid[0], f"the only sample of its group left ({len(group.samples) - 1} others failed or refused)")
            logger.warning("trajectory %s refused for training: %s", valid[0].idx, valid[0].refused)
            refused += 1
    return refused


def _untrainable_reason(trajectory: Trajectory, ledger: SampleLedger) -> str | None:
    """Why `trajectory` cannot be trained (None: it can). A run that passes but recorded no weight versions gets
    the ledger's."""
    runs = trajectory.token_runs()
    for i, run in enumerate(runs):
        check = ledger.check_run(run)
        if check.reason is not None:
            return f"run {i}: {check.reason}" if len(runs) > 1 else check.reason
        if run.weight_versions is None and trajectory.runs:
            run.weight_versions = check.weight_versions
    return None


def load_classes(*, tools: Sequence[str | PluginRef], environment: PluginRef | None, agent: PluginRef | None) -> None:
    """Import every class a training config names, and check its kind and its contract (`rollout.contracts`: the
    methods the harness or the trainer calls, and the constructor with the config's kwargs plus what the run
    passes), without building anything: what a run does before it starts its engine, so that a bad dotted path or a
    class that would fail every trajectory fails in seconds.

    Raises:
        ConfigError: naming the entry, the path and what is missing (see `load_object`), an unknown built-in tool
            name, or the class, method and broken contract (see `rollout.contracts`); an MCP server that does not
            start or lacks a tool named (each MCP entry's server is started, asked for its tools and stopped).
    """
    from agentic_rl.tools.base import Tool
    from agentic_rl.tools.mcp import MCPToolsEntry, check_mcp_server
    from agentic_rl.tools.registry import TOOL_NAMES

    for i, entry in enumerate(tools):
        if isinstance(entry, MCPToolsEntry):
            check_mcp_server(entry)  # started, its tools listed, stopped: a broken server fails before the engine
            continue
        if isinstance(entry, str) and ":" not in entry:
            if entry not in TOOL_NAMES:
                raise ConfigError(
                    f"unknown tool {entry!r}: use one of {', '.join(TOOL_NAMES)} or a Tool class as "
                    "'package.module:Class'"
                )
            continue
        ref = PluginRef.model_validate(entry)
        what = f"tools[{i}]"
        cls = ref.load(what=what, base=Tool)
        check_constructor(cls, what=what, path=ref.path, kwargs=ref.kwargs, caller="harness")
        check_tool(cls, what=what, path=ref.path)
    if environment is not None:
        cls = environment.load(what="environment", base=Environment)
        given = ["tools"] if _takes_tools(environment, cls, tools) else []
        if issubclass(cls, ToolEnvironment):
            given.append("tools_in_system_prompt")
        check_constructor(
            cls, what="environment", path=environment.path, kwargs=environment.kwargs, given=given, caller="harness"
        )
        check_environment(cls, path=environment.path)
    if agent is not None:
        cls = agent.load(what="agent", base=BaseEngineWrapper)
        check_constructor(cls, what="agent", path=agent.path, kwargs=agent.kwargs, given=_AGENT_SETTINGS)
        check_agent(cls, path=agent.path)


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # a signature Python cannot read: let the constructor decide
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}


def build_training_rollout(
    engine: Engine,
    renderer: ChatRenderer,
    tokenizer: Any,
    *,
    harness: HarnessConfig,
    n_parallel_agents: int,
    tools: Sequence[str | PluginRef],
    reward_fn: RewardCallable | None,
    environment: PluginRef | None = None,
    agent: PluginRef | None = None,
    system_prompt: str | None = None,
) -> TrainingRollout:
    """The rollout source of a training run, sampling through `engine` recorded in a fresh `SampleLedger`.

    Args:
        engine: the run's engine (the one the trainer syncs weights into).
        renderer: the model's chat template.
        tokenizer: the model's tokenizer (handed to an agent's constructor).
        harness: limits and sampling of the harness (the built-in agent and a user's environment).
        n_parallel_agents: trajectories in flight at once.
        tools: tool names or classes (`build_tools`), for the built-in `ToolEnvironment`, or for a user's
            environment whose constructor takes `tools`.
        reward_fn: the final answer's reward, under the harness.
        environment: a user's `Environment` class and its keyword arguments, run under the harness.
        agent: a user's `BaseEngineWrapper` subclass and its keyword arguments: built with the harness's limits,
            given the engine (`use_engine`), then `initialize()`d.
        system_prompt: the built-in `ToolEnvironment`'s system message (None: its default).

    Raises:
        ConfigError: naming the class and what is wrong with it (see `PluginRef.build`); for an environment that
            takes no `tools` while tools were given.
    """
    from agentic_rl.tools.registry import build_tools

    ledger = SampleLedger()
    recording = RecordingEngine(engine, ledger)
    if agent is not None:
        return AgentRollout(_build_agent(agent, recording, renderer, tokenizer, harness, n_parallel_agents), ledger)
    built_tools = build_tools(tools)
    check_tools(built_tools)  # as built: a tool may set its schema in its constructor
    env = build_environment(environment, built_tools, renderer, system_prompt)
    return SpecRollout(RolloutSpec(recording, env, renderer, harness, reward_fn=reward_fn), n_parallel_agents, ledger)


def build_environment(
    ref: PluginRef | None, tools: list[Any], renderer: ChatRenderer, system_prompt: str | None = None
) -> Environment:
    """The built-in `ToolEnvironment` over `tools` (with `system_prompt`), or the environment `ref` names (given
    `tools` when its constructor takes them; its own system prompt).

    Raises:
        ConfigError: naming the class and what is wrong with it (`PluginRef.build`, `check_environment`), or tools
            given to an environment that takes none.
    """
    if ref is None:
        return ToolEnvironment.for_renderer(tools, renderer, system_prompt)
    cls = ref.load(what="environment", base=Environment)
    extra: dict[str, Any] = {"tools": tools} if _takes_tools(ref, cls, tools) else {}
    if issubclass(cls, ToolEnvironment):
        extra["tools_in_system_prompt"] = not renderer.supports_tools
        if system_prompt is not None:  # e.g. `agentic-rl rollout --system-prompt-file` (else the class's own)
            extra["system_prompt"] = system_prompt
    environment = ref.build(what="environment", base=Environment, **extra)
    check_environment(environment, path=ref.path)
    return environment


def _takes_tools(ref: PluginRef, cls: type, tools: Sequence[Any]) -> bool:
    """Whether the environment class is given the tools (a `ToolEnvironment`, or a constructor with `tools`).

    Raises:
        ConfigError: if it takes none while tools were given.
    """
    if issubclass(cls, ToolEnvironment) or "tools" in _parameters(cls):
        return True
    if tools:
        raise ConfigError(
            f"environment {ref.path!r} takes no 'tools' argument, but tools were given: set tools: [] "
            "or give the environment its tools through environment.kwargs"
        )
    return False


def _build_agent(
    ref: PluginRef,
    engine: Engine,
    renderer: ChatRenderer,
    tokenizer: Any,
    harness: HarnessConfig,
    n_parallel_agents: int,
) -> BaseEngineWrapper:
    """The user's agent, built with the harness's limits and sampling, on `engine`, initialized."""
    cls = ref.load(what="agent", base=BaseEngineWrapper)
    settings = {  # _AGENT_SETTINGS
        "agent_name": cls.__name__,
        "tokenizer": tokenizer,
        "sampling_params": harness.sampling.model_dump(exclude_none=True),
        "max_prompt_length": harness.max_prompt_length,
        "max_response_length": harness.max_response_length,
        "n_parallel_agents": n_parallel_agents,
        "max_steps": harness.max_steps,
    }
    agent = ref.build(what="agent", base=BaseEngineWrapper, **settings)
    agent.use_engine(engine, renderer)
    try:
        agent.initialize()
    except Exception as exc:
        raise ConfigError(f"agent {ref.path!r}: initialize() failed: {type(exc).__name__}: {exc}") from exc
    return agent
