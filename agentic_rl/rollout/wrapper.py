"""`BaseEngineWrapper`: the public entry point that turns tasks into trajectories, and a ready tool-agent wrapper."""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictStr

from agentic_rl.config import Config
from agentic_rl.engine.base import Engine, TrainableEngine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError
from agentic_rl.limits import MaxPromptLength, MaxResponseLength, MaxSteps, NParallelAgents, bounds, describe
from agentic_rl.rollout.harness import run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.rollout.tasks import checked_task, failed_trajectory
from agentic_rl.server.group import EngineServers
from agentic_rl.types import StepTrajectory, TerminationReason, Trajectory

__all__ = ["BaseEngineWrapper", "ToolAgentEngineWrapper"]

logger = logging.getLogger(__name__)

MAX_PROMPT_LENGTH = bounds(MaxPromptLength)[1]
MAX_RESPONSE_LENGTH = bounds(MaxResponseLength)[1]


class _WrapperArgs(Config):
    """The checks of `BaseEngineWrapper`'s arguments (positional, as the AgentSDK API gives them)."""

    model_config = ConfigDict(strict=True)

    agent_name: Annotated[StrictStr, Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    sampling_params: SamplingConfig
    max_prompt_length: MaxPromptLength
    max_response_length: MaxResponseLength
    n_parallel_agents: NParallelAgents
    max_steps: MaxSteps


_ALLOWED = {
    "agent_name": "a non-empty string of letters, digits and underscores, not starting with a digit",
    "sampling_params": "a dict of SamplingConfig options",
    "max_prompt_length": describe(MaxPromptLength),
    "max_response_length": describe(MaxResponseLength),
    "n_parallel_agents": describe(NParallelAgents),
    "max_steps": describe(MaxSteps),
}


class BaseEngineWrapper(abc.ABC):
    """Base of every agent wrapper: validated settings, task checking and concurrent trajectory generation.

    Subclasses implement `initialize()` (set up the engine and environment) and `generate_trajectory()` (one
    task -> one trajectory); `generate_agent_trajectories_async` runs the tasks with at most `n_parallel_agents`
    in flight.

    Args:
        agent_name: letters, digits and underscores, not starting with a digit.
        tokenizer: a `transformers` `PreTrainedTokenizer` or `PreTrainedTokenizerFast`.
        sampling_params: a dict of `SamplingConfig` options for every turn (`max_tokens` caps a turn), or a
            `SamplingConfig`; kept as a dict of the options given (`sampling_params`) and typed (`sampling`). An
            unknown option (e.g. `max_token`) or a bad value raises here, before any engine starts.
        max_prompt_length: most tokens of a first prompt, in [1, 131072].
        max_response_length: most tokens after the first prompt, in [1, 8192].
        n_parallel_agents: trajectories in flight at once, in [1, 64].
        max_steps: most assistant turns per trajectory, in [1, 10].

    Raises:
        ConfigError: naming the parameter, its value and the allowed range or type.
    """

    def __init__(
        self,
        agent_name: str,
        tokenizer: Any,
        sampling_params: dict[str, Any] | None = None,
        max_prompt_length: int = MAX_PROMPT_LENGTH,
        max_response_length: int = MAX_RESPONSE_LENGTH,
        n_parallel_agents: int = 8,
        max_steps: int = 5,
    ) -> None:
        from transformers import PreTrainedTokenizer, PreTrainedTokenizerFast

        if not isinstance(tokenizer, (PreTrainedTokenizer, PreTrainedTokenizerFast)):
            raise ConfigError(
                f"tokenizer must be a PreTrainedTokenizer or PreTrainedTokenizerFast, got {type(tokenizer).__name__}"
            )
        values = {
            "agent_name": agent_name,
            "sampling_params": {} if sampling_params is None else sampling_params,
            "max_prompt_length": max_prompt_length,
            "max_response_length": max_response_length,
            "n_parallel_agents": n_parallel_agents,
            "max_steps": max_steps,
        }
        if not isinstance(values["sampling_params"], (dict, SamplingConfig)):
            raise ConfigError(f"sampling_params={sampling_params!r} is invalid: expected {_ALLOWED['sampling_params']}")
        try:
            args = _WrapperArgs(**values)
        except ConfigError as exc:
            field = exc.path[1]
            if field == "sampling_params":  # name the option: `sampling_params.max_token is not a known field`
                raise ConfigError(str(exc).removeprefix("_WrapperArgs.")) from None
            raise ConfigError(f"{field}={values[field]!r} is invalid: expected {_ALLOWED[field]}") from None
        self.agent_name = args.agent_name
        self.tokenizer = tokenizer
        self.sampling = args.sampling_params
        self.sampling_params = self.sampling.model_dump(exclude_unset=True)
        self.max_prompt_length = args.max_prompt_length
        self.max_response_length = args.max_response_length
        self.n_parallel_agents = args.n_parallel_agents
        self.max_steps = args.max_steps
        self.engines: list[Engine] = []  # filled by initialize()
        self._servers: EngineServers | None = None

    # ---- OpenAI-compatible access to the engines ------------------------------------------------------------

    def _ensure_servers(self) -> EngineServers:
        if self._servers is None:
            self._servers = EngineServers(self.engines, self.tokenizer, model_name=self.agent_name)
        return self._servers

    def start_servers(self, *, host: str = "127.0.0.1", ports: Sequence[int] | None = None) -> list[str]:
        """Serve each engine over HTTP (OpenAI API) on `host`, one port per engine (0 = a free port).

        Returns:
            `server_addresses`.
        """
        return self._ensure_servers().start(host=host, ports=ports)

    def stop_servers(self) -> None:
        """Stop the HTTP servers. Idempotent."""
        if self._servers is not None:
            self._servers.stop()

    @property
    def server_addresses(self) -> list[str]:
        """`"IP:PORT"` of each engine's OpenAI-compatible server ([] before `start_servers`)."""
        return [] if self._servers is None else self._servers.addresses

    @property
    def completions(self) -> list[Callable[..., dict[str, Any]]]:
        """One callable per engine: `completions[i](request) -> response`, the server's logic without HTTP.

        `request` is the JSON body of `/v1/completions` (with `prompt`) or `/v1/chat/completions` (with
        `messages`); the response is the same JSON. It blocks until done; call it from synchronous code or a worker
        thread (from async code, use `acompletions`). Invalid requests raise `RequestError` (`.status` 400/404).
        """
        servers = self._ensure_servers()
        return [servers.completion(i) for i in range(len(servers.servings))]

    @property
    def acompletions(self) -> list[Callable[..., Any]]:
        """Async twins of `completions`: `await acompletions[i](request, trajectory_id=None)`."""
        return self._ensure_servers().acompletions

    def captured_trajectory(self, trajectory_id: str, *, engine_index: int = 0, pop: bool = True) -> StepTrajectory:
        """The trajectory recorded from calls tagged with `trajectory_id` (header `X-Trajectory-Id`).

        Raises:
            KeyError: if no call was captured under that id.
        """
        return self._ensure_servers().captured_trajectory(trajectory_id, engine_index=engine_index, pop=pop)

    @abc.abstractmethod
    def initialize(self) -> None:
        """Set up the engine(s) and environment. Called once before generating."""

    @abc.abstractmethod
    async def generate_trajectory(self, task: dict[str, Any], idx: int) -> Trajectory:
        """Run one validated task; must return a failed trajectory rather than raise."""

    async def generate_agent_trajectories_async(
        self,
        tasks: Sequence[dict[str, Any]],
        *,
        on_result: Callable[[Trajectory], None] | None = None,
        indices: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """Generate one trajectory per task, concurrently.

        Args:
            tasks: dicts with `id`, `question` and `ground_truth`.
            on_result: called with each trajectory as it finishes.
            indices: each task's batch index (`Trajectory.idx`, which also offsets its sampling seed); default
                0, 1, ... A run that continues an interrupted one passes its remaining tasks' original positions.

        Returns:
            Trajectories in task order. A malformed task gives a failed trajectory (`termination_reason`
            `invalid_task`, the problem in `error`); an exception from `generate_trajectory` (or a result that is
            not a `Trajectory`) gives a failed trajectory with `termination_reason` `error`; the other tasks still
            run.

        Raises:
            ConfigError: before any task runs, if the wrapper is not ready (e.g. `initialize()` was not called), or
                `indices` is not one distinct int per task.
        """

        self._check_ready()

        async def run_one(task: Any, idx: int) -> Trajectory:
            checked = checked_task(idx, task)
            if isinstance(checked, Trajectory):
                return checked
            try:
                result = await self.generate_trajectory(checked, idx)
            except Exception as exc:  # a subclass that raises fails this task only
                logger.exception("generate_trajectory failed for task %d", idx)
                return failed_trajectory(idx, checked, TerminationReason.ERROR, f"{type(exc).__name__}: {exc}")
            if not isinstance(result, Trajectory):
                error = f"generate_trajectory returned {type(result).__name__}, expected a Trajectory"
                logger.error("task %d: %s", idx, error)
                return failed_trajectory(idx, checked, TerminationReason.ERROR, error)
            return result

        return await run_tasks(list(tasks), run_one, n_parallel_agents=self.n_parallel_agents, on_result=on_result,
                               indices=indices)  # fmt: skip

    def _check_ready(self) -> None:  # noqa: B027  (an optional hook: the base wrapper is always ready)
        """Raise `ConfigError` before any task starts if the wrapper cannot generate yet (override as needed)."""


class ToolAgentEngineWrapper(BaseEngineWrapper):
    """A ready agent: an in-process vLLM engine, a `ToolEnvironment` over `tools`, and a reward function.

    Args:
        agent_name, tokenizer, sampling_params, max_prompt_length, max_response_length, n_parallel_agents,
        max_steps: as in `BaseEngineWrapper`.
        model: local folder of the model the engine serves (see `agentic_rl.models.resolve_model`).
        tools: the tools offered to the model.
        reward_fn: `reward_fn(task, messages) -> float` for the final answer (default: the GSM8K reward).
        system_prompt: system message; tool descriptions are added to it when the chat template has no `tools`
            support.
        engine: an already built engine to use instead of building one from `model`.
        engine_options: extra `VLLMEngineConfig` fields (`dtype`, `kv_cache_gib`, `max_model_len`, ...).
        toolcall_weight: scale of the well-formed tool-call reward.
        check_alignment: verify each trajectory's ids against a full template re-render.
        serve: start the OpenAI-compatible server of each engine in `initialize()` (see `server_addresses`).
        memory: a `MemoryConfig` (or dict) to prompt each turn through agent memory; with `use_summary` and no
            `oai_client`, summaries come from this wrapper's own engine, called in process.
        turn_timeout_s: most seconds one engine request may take before it is aborted and its trajectory fails
            with `termination_reason="timeout"` (see `HarnessConfig`).
        chat_template_kwargs: extra variables for the chat template on every render (e.g.
            `{"enable_thinking": False}`).
    """

    def __init__(
        self,
        agent_name: str,
        tokenizer: Any,
        sampling_params: dict[str, Any] | None = None,
        max_prompt_length: int = MAX_PROMPT_LENGTH,
        max_response_length: int = MAX_RESPONSE_LENGTH,
        n_parallel_agents: int = 8,
        max_steps: int = 5,
        *,
        model: str | Path | None = None,
        tools: Sequence[Any] = (),
        reward_fn: RewardCallable | None = None,
        system_prompt: str | None = None,
        engine: Engine | None = None,
        engine_options: dict[str, Any] | None = None,
        toolcall_weight: float = 0.1,
        check_alignment: bool = True,
        serve: bool = True,
        memory: Any = None,
        turn_timeout_s: float = 3600.0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            agent_name, tokenizer, sampling_params, max_prompt_length, max_response_length, n_parallel_agents,
            max_steps,
        )  # fmt: skip
        if engine is None and model is None:
            raise ConfigError("give either model= (a local model folder) or engine= (a started engine)")
        from agentic_rl.rollout.rewards import gsm8k_reward

        self.model = model
        self.tools = list(tools)
        self.reward_fn = gsm8k_reward if reward_fn is None else reward_fn
        self.system_prompt = system_prompt
        self.engine = engine
        self._owned_engine: TrainableEngine | None = None  # the engine initialize() built; close() stops it
        self.engine_options = dict(engine_options or {})
        self.harness_config = HarnessConfig(
            max_steps=self.max_steps,
            max_prompt_length=self.max_prompt_length,
            max_response_length=self.max_response_length,
            sampling=self.sampling,
            toolcall_weight=toolcall_weight,
            check_alignment=check_alignment,
            turn_timeout_s=turn_timeout_s,
        )
        self.serve = serve
        self.memory_config = memory
        self.memory_factory: Callable[[], Any] | None = None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._spec: RolloutSpec | None = None

    @property
    def spec(self) -> RolloutSpec:
        """The `RolloutSpec` this wrapper runs trajectories with: always the wrapper's current `engine`,
        `harness_config`, `reward_fn` and `memory_factory`, also when they were set after `initialize()`.

        Raises:
            ConfigError: before `initialize()`.
        """
        if self._spec is None or self.engine is None:
            raise ConfigError("call initialize() before generating trajectories")
        current = {"engine": self.engine, "config": self.harness_config, "reward_fn": self.reward_fn,
                   "memory_factory": self.memory_factory}  # fmt: skip
        if any(getattr(self._spec, name) is not value for name, value in current.items()):  # set after initialize()
            self._spec = dataclasses.replace(self._spec, **current)
        return self._spec

    @property
    def renderer(self) -> Any:
        """The `ChatRenderer` of the tokenizer's template (None before `initialize()`)."""
        return None if self._spec is None else self._spec.renderer

    @property
    def environment(self) -> Any:
        """The `ToolEnvironment` over `tools` (None before `initialize()`)."""
        return None if self._spec is None else self._spec.environment

    def initialize(self) -> None:
        """Build the chat renderer, the tool environment and (unless given) the vLLM engine; blocks until ready."""
        from agentic_rl.chat import ChatRenderer
        from agentic_rl.rollout.agent import start_engine, tool_agent_spec

        renderer = ChatRenderer(self.tokenizer, template_kwargs=self.chat_template_kwargs)  # checked before the engine
        if self.engine is None:
            self.engine = self._owned_engine = start_engine(
                self.model, self.engine_options, max_prompt_length=self.max_prompt_length,
                max_response_length=self.max_response_length,
            )  # fmt: skip
        self.engines = [self.engine]
        if self.serve:
            self.start_servers()
        if self.memory_config is not None:
            self.memory_factory = self._memory_factory(renderer)
        self._spec = tool_agent_spec(renderer, self.engine, tools=self.tools, config=self.harness_config,
                                     reward_fn=self.reward_fn, system_prompt=self.system_prompt,
                                     memory_factory=self.memory_factory)  # fmt: skip

    def _memory_factory(self, renderer: Any) -> Callable[[], Any]:
        from agentic_rl.engine.chat_client import EngineChatClient
        from agentic_rl.memory import MemoryConfig, MemorySimple, MemorySummary

        config = (
            self.memory_config if isinstance(self.memory_config, MemoryConfig) else MemoryConfig(**self.memory_config)
        )
        if not config.use_summary:
            return lambda: MemorySimple(config, tokenizer=self.tokenizer)
        client = None
        if config.oai_client is None:  # summaries from our own engine, called in process (no HTTP server)
            client = EngineChatClient(self.engine, renderer)
        return lambda: MemorySummary(config, chat_client=client, tokenizer=self.tokenizer)

    def _check_ready(self) -> None:
        self.spec  # noqa: B018  (raises ConfigError before initialize())

    async def generate_trajectory(self, task: dict[str, Any], idx: int) -> StepTrajectory:
        return await run_trajectory(task, idx, self.spec)

    def make_rollout(self, *, sampling: SamplingConfig | dict[str, Any] | None = None) -> Any:
        """A `Rollout` over this wrapper's spec, which can be quiesced and resumed.

        Args:
            sampling: other sampling options for this rollout (e.g. greedy for evaluation); default the wrapper's.

        Raises:
            ConfigError: if `initialize()` was not called, or `sampling` is invalid.
        """
        from agentic_rl.rollout.session import Rollout

        spec = self.spec if sampling is None else self.spec.with_sampling(sampling)
        return Rollout(spec, n_parallel_agents=self.n_parallel_agents)

    async def close(self) -> None:
        """Stop the servers, close the environment's tools (their HTTP clients), and stop the engine this wrapper
        built (an engine passed in is left running). Call it from the event loop that ran the rollouts."""
        from agentic_rl.rollout.agent import close_tool_agent

        self.stop_servers()
        if self._spec is not None:
            await close_tool_agent(self._spec, engine=self._owned_engine)
        elif self._owned_engine is not None:
            await self._owned_engine.close()
