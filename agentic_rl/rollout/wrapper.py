"""`BaseEngineWrapper`: the public entry point that turns tasks into trajectories, and a ready tool-agent wrapper."""

from __future__ import annotations

import abc
import dataclasses
import inspect
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
from agentic_rl.rollout.contracts import check_reward, check_tools
from agentic_rl.rollout.harness import run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.rollout.tasks import checked_task, failed_trajectory
from agentic_rl.server.group import EngineServers
from agentic_rl.types import StepTrajectory, TerminationReason, Trajectory

__all__ = ["BaseEngineWrapper", "ToolAgentEngineWrapper", "collect_trajectories"]

logger = logging.getLogger(__name__)

MAX_PROMPT_LENGTH = bounds(MaxPromptLength)[1]
MAX_RESPONSE_LENGTH = bounds(MaxResponseLength)[1]


class _WrapperArgs(Config):
    """The checks of `BaseEngineWrapper`'s arguments (positional, as the AgentSDK API gives them)."""

    model_config = ConfigDict(strict=True)

    agent_name: Annotated[StrictStr, Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    max_prompt_length: MaxPromptLength
    max_response_length: MaxResponseLength
    n_parallel_agents: NParallelAgents
    max_steps: MaxSteps


_ALLOWED = {
    "agent_name": "a non-empty string of letters, digits and underscores, not starting with a digit",
    "sampling_params": "a dict (of options for the agent's engine)",
    "max_prompt_length": describe(MaxPromptLength),
    "max_response_length": describe(MaxResponseLength),
    "n_parallel_agents": describe(NParallelAgents),
    "max_steps": describe(MaxSteps),
}


class BaseEngineWrapper(abc.ABC):
    """Base of every agent wrapper: validated settings, task checking and concurrent trajectory generation.

    A subclass implements `initialize()` (set up the engine and environment) and one of:

    - `generate_agent_trajectories_async(tasks)`, the AgentSDK's method: all tasks -> one trajectory each, in task
      order, as a plain function or a coroutine function (the trainer runs a plain one in a worker thread: from
      there, reach async code such as `engine.generate` with `anyio.from_thread.run`); or
    - `generate_trajectory(task, idx)`: one validated task -> one trajectory. The base class's
      `generate_agent_trajectories_async` then validates the tasks, runs at most `n_parallel_agents` at once and
      turns a task that raises into a failed trajectory (the others still run).

    A class that defines neither cannot be instantiated (`TypeError` naming both).

    Training your own agent (`TrainConfig.agent`): the trainer builds the class with the rollout section's settings
    (and the config's `agent.kwargs`), hands it the run's engine with `use_engine()` before `initialize()` (so
    `initialize()` must build an engine only when `self.engine` is None), and sets each rollout's sampling options
    with `set_sampling()` (read `self.sampling_params` when generating, not once in `initialize()`). A trajectory is
    trained only if its token runs are exact: every token with mask 1 was sampled by that engine, in that context,
    with the engine's logprobs (`Trajectory.from_runs`, or the token fields of one run); any other record is refused
    with the reason, counted and left out of the loss.

    Args:
        agent_name: letters, digits and underscores, not starting with a digit.
        tokenizer: a `transformers` `PreTrainedTokenizer` or `PreTrainedTokenizerFast`.
        sampling_params: a dict of options for the agent's engine, kept as given (copied). The base class does not
            interpret it: what hands the options to our engine checks them (`ToolAgentEngineWrapper`,
            `HarnessConfig`), and an agent of your own reads whichever options it understands.
        max_prompt_length: most tokens of a first prompt, in [1, 131072].
        max_response_length: most tokens after the first prompt, in [1, 8192].
        n_parallel_agents: trajectories in flight at once, in [1, 64].
        max_steps: most assistant turns per trajectory, in [1, 10].

    Raises:
        ConfigError: naming the parameter, its value and the allowed range or type.
        TypeError: for a class that defines neither `generate_agent_trajectories_async` nor `generate_trajectory`.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> BaseEngineWrapper:
        if not _defines_generation(cls):
            raise TypeError(
                f"Can't instantiate {cls.__name__}: define generate_agent_trajectories_async(self, tasks) (all tasks, "
                "plain or async) or generate_trajectory(self, task, idx) (one task, async)"
            )
        return super().__new__(cls)

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
            "max_prompt_length": max_prompt_length,
            "max_response_length": max_response_length,
            "n_parallel_agents": n_parallel_agents,
            "max_steps": max_steps,
        }
        try:
            args = _WrapperArgs(**values)
        except ConfigError as exc:
            field = exc.path[1]
            raise ConfigError(f"{field}={values[field]!r} is invalid: expected {_ALLOWED[field]}") from None
        self.agent_name = args.agent_name
        self.tokenizer = tokenizer
        self.sampling_params: dict[str, Any] = {}
        self.set_sampling({} if sampling_params is None else sampling_params)
        self.max_prompt_length = args.max_prompt_length
        self.max_response_length = args.max_response_length
        self.n_parallel_agents = args.n_parallel_agents
        self.max_steps = args.max_steps
        self.engine: Engine | None = None  # the engine trajectories are sampled with (`use_engine`, `initialize`)
        self.engines: list[Engine] = []  # filled by initialize()
        self._servers: EngineServers | None = None

    def set_sampling(self, sampling_params: dict[str, Any] | SamplingConfig) -> None:
        """Set the sampling options of the next trajectories (`sampling_params`, copied).

        The trainer calls it before each rollout: the config's options with the step's seed, or greedy ones for a
        held-out evaluation. Subclasses that keep typed options override it (and call this one).

        Raises:
            ConfigError: if `sampling_params` is not a dict (or a `SamplingConfig`).
        """
        if isinstance(sampling_params, SamplingConfig):
            sampling_params = sampling_params.model_dump(exclude_unset=True)
        if not isinstance(sampling_params, dict):
            raise ConfigError(f"sampling_params={sampling_params!r} is invalid: expected {_ALLOWED['sampling_params']}")
        self.sampling_params = dict(sampling_params)

    def use_engine(self, engine: Engine, renderer: Any = None) -> None:
        """Sample with `engine` (and render with `renderer`, a `ChatRenderer` of the tokenizer's template) instead of
        building an engine: the trainer calls it before `initialize()` with the engine it syncs weights into."""
        self.engine = engine
        self.engines = [engine]
        if renderer is not None:
            self.renderer = renderer

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

    async def generate_trajectory(self, task: dict[str, Any], idx: int) -> Trajectory:
        """Run one validated task (`idx`: its position in the batch). Define it, or override
        `generate_agent_trajectories_async`; an exception fails this task only."""
        raise NotImplementedError(f"{type(self).__name__} does not define generate_trajectory")

    async def close(self) -> None:  # noqa: B027  (an optional hook)
        """Release what `initialize()` started (the trainer calls it when the run ends; it closes the engine it
        handed over itself). The default stops the HTTP servers."""
        self.stop_servers()

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

        return await run_tasks(
            list(tasks), run_one, n_parallel_agents=self.n_parallel_agents, on_result=on_result, indices=indices
        )

    def _check_ready(self) -> None:  # noqa: B027  (an optional hook: the base wrapper is always ready)
        """Raise `ConfigError` before any task starts if the wrapper cannot generate yet (override as needed)."""


def _defines_generation(cls: type) -> bool:
    """Whether `cls` overrides `generate_agent_trajectories_async` or `generate_trajectory` of the base class."""
    return any(
        getattr(cls, name) is not getattr(BaseEngineWrapper, name)
        for name in ("generate_agent_trajectories_async", "generate_trajectory")
    )


async def collect_trajectories(agent: BaseEngineWrapper, tasks: Sequence[dict[str, Any]]) -> list[Any]:
    """`agent.generate_agent_trajectories_async(tasks)`, however the agent defines it: awaited when it is a
    coroutine function (or returns an awaitable), run in a worker thread when it is a plain function (it may block).

    Returns:
        What the agent returned, as a list (not checked here).

    Raises:
        TypeError: if the agent returns something that is not a list or tuple.
    """
    method = agent.generate_agent_trajectories_async
    if inspect.iscoroutinefunction(method):
        result = await method(tasks)
    else:
        import anyio

        result = await anyio.to_thread.run_sync(method, list(tasks))
        if inspect.isawaitable(result):
            result = await result
    if not isinstance(result, (list, tuple)):
        raise TypeError(
            f"{type(agent).__name__}.generate_agent_trajectories_async returned {type(result).__name__}, "
            "expected a list of trajectories"
        )
    return list(result)


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
        toolcall_weight, milestone_weight, unfinished_penalty, check_alignment, template_rewrites, turn_timeout_s,
            env_timeout_s, close_timeout_s, reward_timeout_s, max_retries: the `HarnessConfig` fields of those names
            (the reward shaping, the template re-render check, what a template that rewrites history does, the
            timeouts, and the retries of failures outside the policy),
            with its defaults; `harness_config` holds them with the
            limits and sampling.
        serve: start the OpenAI-compatible server of each engine in `initialize()` (see `server_addresses`).
        memory: a `MemoryConfig` (or dict) to prompt each turn through agent memory; with `use_summary` and no
            `oai_client`, summaries come from this wrapper's own engine, called in process.
        chat_template_kwargs: extra variables for the chat template on every render (e.g.
            `{"enable_thinking": False}`).

    Raises:
        ConfigError: as `BaseEngineWrapper`; without `model` and `engine`; for a tool or `reward_fn` that breaks
            what the harness calls on it (`rollout.contracts`: the method, or a `parameters` schema, and what is
            wrong).
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
        env_timeout_s: float = 600.0,
        chat_template_kwargs: dict[str, Any] | None = None,
        milestone_weight: float = 0.0,
        unfinished_penalty: float = 0.0,
        close_timeout_s: float = 30.0,
        reward_timeout_s: float = 60.0,
        template_rewrites: str = "new_run",
        max_retries: int = 2,
    ) -> None:
        super().__init__(
            agent_name,
            tokenizer,
            sampling_params,
            max_prompt_length,
            max_response_length,
            n_parallel_agents,
            max_steps,
        )
        if engine is None and model is None:
            raise ConfigError("give either model= (a local model folder) or engine= (a started engine)")
        from agentic_rl.rewards.math import gsm8k_reward

        self.model = model
        self.tools = list(tools)
        self.reward_fn = gsm8k_reward if reward_fn is None else reward_fn
        check_tools(self.tools)  # what the harness calls on them, before any engine starts
        check_reward(self.reward_fn, what="reward_fn")
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
            milestone_weight=milestone_weight,
            unfinished_penalty=unfinished_penalty,
            check_alignment=check_alignment,
            turn_timeout_s=turn_timeout_s,
            env_timeout_s=env_timeout_s,
            close_timeout_s=close_timeout_s,
            reward_timeout_s=reward_timeout_s,
            template_rewrites=template_rewrites,
            max_retries=max_retries,
        )
        self.serve = serve
        self.memory_config = memory
        self.memory_factory: Callable[[], Any] | None = None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._spec: RolloutSpec | None = None

    def set_sampling(self, sampling_params: dict[str, Any] | SamplingConfig) -> None:
        """Set the sampling options of the next trajectories, checked as `SamplingConfig` options (typed in
        `sampling`).

        Raises:
            ConfigError: naming an unknown option (e.g. `sampling_params.max_token is not a known field`) or a bad
                value.
        """
        if not isinstance(sampling_params, (dict, SamplingConfig)):
            super().set_sampling(sampling_params)  # raises: not a dict
        try:
            sampling = SamplingConfig.of(sampling_params)
        except ConfigError as exc:  # name the option as the caller wrote it
            raise ConfigError("sampling_params." + str(exc).removeprefix("SamplingConfig.")) from None
        super().set_sampling(sampling)
        self.sampling = sampling
        if hasattr(self, "harness_config"):
            self.harness_config = self.harness_config.model_copy(update={"sampling": sampling})

    def use_engine(self, engine: Engine, renderer: Any = None) -> None:
        """Sample with `engine` instead of building one (the renderer is built from the tokenizer in
        `initialize()`)."""
        self.engine = engine
        self.engines = [engine]

    @property
    def spec(self) -> RolloutSpec:
        """The `RolloutSpec` this wrapper runs trajectories with: always the wrapper's current `engine`,
        `harness_config`, `reward_fn` and `memory_factory`, also when they were set after `initialize()`.

        Raises:
            ConfigError: before `initialize()`.
        """
        if self._spec is None or self.engine is None:
            raise ConfigError("call initialize() before generating trajectories")
        current = {
            "engine": self.engine,
            "config": self.harness_config,
            "reward_fn": self.reward_fn,
            "memory_factory": self.memory_factory,
        }
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

        renderer = ChatRenderer(  # checked before the engine
            self.tokenizer,
            template_kwargs=self.chat_template_kwargs,
            history_rewrites=self.harness_config.template_rewrites == "new_run",
        )
        if self.engine is None:
            self.engine = self._owned_engine = start_engine(
                self.model,
                self.engine_options,
                max_prompt_length=self.max_prompt_length,
                max_response_length=self.max_response_length,
            )
        self.engines = [self.engine]
        if self.serve:
            self.start_servers()
        if self.memory_config is not None:
            self.memory_factory = self._memory_factory(renderer)
        self._spec = tool_agent_spec(
            renderer,
            self.engine,
            tools=self.tools,
            config=self.harness_config,
            reward_fn=self.reward_fn,
            system_prompt=self.system_prompt,
            memory_factory=self.memory_factory,
        )

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
