"""What the harness and the trainer call on a user's environment, tools, agent and reward, checked when a config is
loaded (`agentic_rl.rollout.contracts`): each user module is written to disk and named by its dotted path, as a user
would, and every refusal names the entry, the class, the method and what is wrong. The legitimate forms (catch-all
signatures, partials, async callable objects, sync tools) and every class the project ships pass."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import textwrap
from pathlib import Path

import pytest
from support.engines import ScriptedEngine

import agentic_rl.environments
import agentic_rl.tools
from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.loop.plan import plan_run
from agentic_rl.loop.rewards import check_reward as check_config_reward
from agentic_rl.loop.sources import load_classes
from agentic_rl.plugins import PluginRef
from agentic_rl.rewards.registry import REWARDS
from agentic_rl.rollout.contracts import check_agent, check_environment, check_reward, check_tool
from agentic_rl.rollout.session import Rollout
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.rollout.wrapper import BaseEngineWrapper, ToolAgentEngineWrapper
from agentic_rl.tools.base import Tool
from agentic_rl.tools.calculator import CalculatorTool

ROOT = Path(__file__).resolve().parents[2]

HEADER = """\
import functools
from typing import Any, Awaitable
from agentic_rl.environments.base import Environment, Sample
from agentic_rl.tools.base import Tool, StatefulTool
from agentic_rl.rollout.wrapper import BaseEngineWrapper
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write `source` as the module `name` in a folder on `sys.path`, as a user's project would hold it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(HEADER + textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def _env(module: str, name: str, **kwargs) -> PluginRef:
    return PluginRef.model_validate({"class": f"{module}:{name}", "kwargs": kwargs})


# ---- environments ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "message"), [
    ("def reset(self, request): ...\n    async def step(self, sample): ...",
     r"environment 'user_envs:Env': `Env.reset` is a plain def; the harness awaits it: make it `async def`"),
    ("async def reset(self, request): ...\n    def step(self, sample): return None, True, {}",
     r"`Env.step` is a plain def; the harness awaits it"),
    ("async def reset(self): ...\n    async def step(self, sample): ...",
     r"`Env.reset\(self\)` cannot take the request argument the harness passes \(reset\(request\)\)"),
    ("async def reset(self, request): ...\n    async def step(self, sample, extra): ...",
     r"`Env.step\(self, sample, extra\)` cannot take the sample argument"),
    ("async def reset(self, request): ...\n    async def step(self, sample): ...\n    def close(self, sample): ...",
     r"`Env.close` is a plain def; the harness awaits it"),
    ("async def reset(self, request): ...\n    async def step(self, sample): ...\n    async def aclose(self, how): ...",
     r"`Env.aclose\(self, how\)` cannot be called with no arguments, as the harness calls it"),
])  # fmt: skip
def test_a_broken_environment_fails_at_load_naming_entry_class_and_method(user_module, body, message):
    module = user_module("user_envs", f"class Env(Environment):\n    {body}\n")
    with pytest.raises(ConfigError, match=message):
        load_classes(tools=[], environment=_env(module, "Env"), agent=None)


def test_an_environment_whose_constructor_needs_what_the_config_omits_fails_at_load(user_module):
    module = user_module(
        "user_env_ctor",
        """
        class SizedEnv(Environment):
            def __init__(self, size: int, tools=()):
                self.size = size
            async def reset(self, request): ...
            async def step(self, sample): ...
    """,
    )
    with pytest.raises(ConfigError, match=r"environment 'user_env_ctor:SizedEnv': the constructor "
                                          r"`SizedEnv\(size: int, tools=\(\)\)` needs size, which neither the harness "
                                          r"nor environment.kwargs gives: add it to environment.kwargs"):  # fmt: skip
        load_classes(tools=[], environment=_env(module, "SizedEnv"), agent=None)
    load_classes(tools=[], environment=_env(module, "SizedEnv", size=3), agent=None)
    with pytest.raises(ConfigError, match=r"takes no argument\(s\) colour \(it takes: size, tools\)"):
        load_classes(tools=[], environment=_env(module, "SizedEnv", size=3, colour=1), agent=None)


def test_legitimate_environment_forms_pass(user_module):
    module = user_module(
        "user_env_forms",
        """
        async def _reset(env, request, **options): ...

        class Awaitables:
            async def __call__(self, sample): ...

        def logged(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapper

        class CatchAll(Environment):
            def __init__(self, *args, **kwargs): ...
            async def reset(self, *args, **kwargs): ...
            async def step(self, *args): ...

        class Odd(Environment):
            reset = functools.partialmethod(_reset, options=None)
            step = Awaitables()                       # a callable object with an async __call__
            @logged
            async def close(self, sample): ...       # a functools.wraps decorator around an async def
            def aclose(self) -> Awaitable[None]:     # a plain def that returns an awaitable
                return _reset(self, None)
            @staticmethod
            async def helper(): ...
    """,
    )
    load_classes(tools=[], environment=_env(module, "CatchAll", anything=1), agent=None)
    load_classes(tools=[], environment=_env(module, "Odd"), agent=None)


# ---- tools ----------------------------------------------------------------------------------------------------


def test_a_tool_whose_parameters_are_not_a_schema_fails_at_load_naming_the_entry(user_module):
    module = user_module(
        "user_tools",
        """
        class BadSchema(Tool):
            name = "bad"
            parameters = {"type": "objekt", "properties": {"x": {"type": "string"}}}
            def execute(self, arguments): return "ok"

        class ListProperties(Tool):
            name = "listy"
            parameters = {"type": "object", "properties": []}
            def execute(self, arguments): return "ok"

        class NotADict(Tool):
            name = "nd"
            parameters = "object"
            def execute(self, arguments): return "ok"

        class NoArguments(Tool):
            name = "noargs"
            def execute(self): return "ok"

        class AsyncTool(Tool):
            name = "async_ok"
            parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
            async def execute(self, arguments): return "ok"

        class SyncClose(Tool):
            name = "sync_close"
            def execute(self, arguments): return "ok"
            def aclose(self): ...

        class Sessions(StatefulTool):
            name = "sessions"
            def session_start(self, session_id): ...
            async def execute_session(self, session_id, arguments): return "ok"
            def session_end(self): ...
    """,
    )
    cases = [
        ("BadSchema", r"tools\[1\] 'user_tools:BadSchema': `BadSchema.parameters` is not a JSON schema the engine can "
                      r"follow \(the OpenAI-compatible server refuses it too\): Unsupported type \"objekt\""),
        ("ListProperties", r"`ListProperties.parameters` is not a JSON schema .*properties must be an object"),
        ("NotADict", r"`NotADict.parameters` must be a JSON schema object \(a dict\), got str"),
        ("NoArguments", r"`NoArguments.execute\(self\)` cannot take the arguments argument the environment passes"),
        ("SyncClose", r"`SyncClose.aclose` is a plain def; the environment awaits it"),
        ("Sessions", r"`Sessions.session_end\(self\)` cannot take the session_id argument"),
    ]  # fmt: skip
    for name, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_classes(tools=["calculator", f"{module}:{name}"], environment=None, agent=None)
    load_classes(tools=[f"{module}:AsyncTool", "calculator"], environment=None, agent=None)  # sync or async execute


def test_the_server_and_the_harness_refuse_the_same_schemas():
    from agentic_rl.server.constraints import output_constraint
    from agentic_rl.server.protocol import ChatCompletionRequest, RequestError, parse_request
    from agentic_rl.tools.schema import schema_problem

    bad = {"type": "object", "properties": {"a": {"$ref": "#/defs/missing"}}}
    assert "Cannot find field defs" in schema_problem(bad)
    assert schema_problem({"type": "object", "properties": {}}) is None
    assert schema_problem({"x": float("nan")}).startswith("not JSON")
    tool = {"type": "function", "function": {"name": "f", "parameters": bad}}
    request = parse_request(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool],
                             "tool_choice": "required"})  # fmt: skip
    with pytest.raises(RequestError, match=r"invalid JSON schema in 'tools.0.function.parameters': Cannot find field"):
        output_constraint(request)


# ---- agents and rewards ---------------------------------------------------------------------------------------


def test_a_broken_agent_fails_at_load_naming_the_method(user_module):
    module = user_module(
        "user_agents",
        """
        class AsyncInit(BaseEngineWrapper):
            async def initialize(self): ...
            async def generate_trajectory(self, task, idx): ...

        class SyncTurn(BaseEngineWrapper):
            def initialize(self): ...
            def generate_trajectory(self, task, idx): ...

        class SyncClose(BaseEngineWrapper):
            def initialize(self): ...
            def generate_agent_trajectories_async(self, tasks): return []
            def close(self): ...

        class Narrow(BaseEngineWrapper):
            def __init__(self, agent_name, tokenizer, depth):
                super().__init__(agent_name, tokenizer)
            def initialize(self): ...
            async def generate_agent_trajectories_async(self, tasks): return []

        class Fine(BaseEngineWrapper):
            def __init__(self, *args, depth: int = 1, **kwargs):
                super().__init__(*args, **kwargs)
            def initialize(self): ...
            def generate_agent_trajectories_async(self, tasks): return []
    """,
    )
    cases = [
        ("AsyncInit", {}, r"agent 'user_agents:AsyncInit': `AsyncInit.initialize` is `async def`; the trainer calls "
                          r"it without awaiting \(it would never run\): make it a plain def"),
        ("SyncTurn", {}, r"`SyncTurn.generate_trajectory` is a plain def; the trainer awaits it: make it `async def`"),
        ("SyncClose", {}, r"`SyncClose.close` is a plain def; the trainer awaits it"),
        ("Narrow", {"depth": 2}, r"the constructor `Narrow\(agent_name, tokenizer, depth\)` cannot take "
                                 r"sampling_params, max_prompt_length, .*which the trainer passes"),
    ]  # fmt: skip
    for name, kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_classes(tools=[], environment=None, agent=_env(module, name, **kwargs))
    load_classes(tools=[], environment=None, agent=_env(module, "Fine", depth=3))


def test_a_reward_that_cannot_take_task_and_messages_fails_at_load(user_module):
    module = user_module(
        "user_rewards",
        """
        def one_arg(task): return 1.0
        def two(task, messages): return 1.0
        async def asynchronous(task, messages, *, scale=1.0): return scale
        def three(task, messages, scale): return scale
        partial = functools.partial(three, scale=2.0)
        class Judge:
            async def __call__(self, task, messages): return 0.5
        judge = Judge()
    """,
    )
    with pytest.raises(ConfigError, match=r"reward 'user_rewards:one_arg': `one_arg\(task\)` cannot take the task and "
                                          r"messages arguments the harness passes"):  # fmt: skip
        check_config_reward(TrainConfig(reward=f"{module}:one_arg"))
    with pytest.raises(
        ConfigError, match=r"reward_metrics\[1\] 'user_rewards:three': `three\(task, messages, scale\)`"
    ):
        check_config_reward(TrainConfig(reward="gsm8k", reward_metrics=[f"{module}:two", f"{module}:three"]))
    with pytest.raises(ConfigError, match=r"reward 'user_rewards:Judge' is a class: give a function"):
        check_config_reward(TrainConfig(reward=f"{module}:Judge"))
    for name in ("two", "asynchronous", "partial", "judge"):
        check_config_reward(TrainConfig(reward=f"{module}:{name}"))


# ---- the Python API -------------------------------------------------------------------------------------------


class ReturnsNothing(Environment):
    def reset(self, request):  # a plain def: the harness would await None
        return None

    async def step(self, sample):
        return None, True, {}


class NoSchema(CalculatorTool):
    parameters = {"type": "object", "properties": {"x": {"type": "nope"}}}


def test_the_python_api_refuses_the_same_faults_naming_the_argument(tokenizer):
    engine = ScriptedEngine(tokenizer)
    spec = RolloutSpec(engine=engine, environment=ReturnsNothing(), renderer=ChatRenderer(tokenizer))
    with pytest.raises(ConfigError, match=r"spec.environment \(.*test_contracts.ReturnsNothing\): `ReturnsNothing.reset` "
                                          r"is a plain def; the harness awaits it"):  # fmt: skip
        Rollout(spec)
    tools_env = RolloutSpec(engine=engine, environment=ToolEnvironment([NoSchema()]), renderer=ChatRenderer(tokenizer))
    with pytest.raises(ConfigError, match=r"spec.environment.tools\['calculator'\] .*`NoSchema.parameters`"):
        Rollout(tools_env)
    with pytest.raises(ConfigError, match=r"tools\[1\] \(.*test_contracts.NoSchema\): `NoSchema.parameters` is not"):
        ToolAgentEngineWrapper("a", tokenizer, engine=engine, tools=[CalculatorTool(), NoSchema()], serve=False)
    with pytest.raises(
        ConfigError, match=r"reward_fn \(.*<lambda>\): `.*<lambda>\(task\)` cannot take the task and messages"
    ):
        ToolAgentEngineWrapper("a", tokenizer, engine=engine, reward_fn=lambda task: 1.0, serve=False)
    ToolAgentEngineWrapper("a", tokenizer, engine=engine, tools=[CalculatorTool()], serve=False)


# ---- what the project ships -----------------------------------------------------------------------------------


def _shipped_modules():
    for package in (agentic_rl.environments, agentic_rl.tools):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            yield importlib.import_module(info.name)
    yield importlib.import_module("agentic_rl.rollout.wrapper")
    for path in sorted((ROOT / "examples").glob("*.py")):
        yield importlib.import_module(f"examples.{path.stem}")


def test_every_class_the_project_ships_passes(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    checked = []
    for module in _shipped_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            if issubclass(cls, Environment):
                check_environment(cls, path=f"{module.__name__}:{cls.__name__}")
            elif issubclass(cls, Tool):
                check_tool(cls, what="tools[0]")
            elif issubclass(cls, BaseEngineWrapper):
                check_agent(cls)
            else:
                continue
            checked.append(cls.__name__)
    assert {"ToolEnvironment", "CalculatorTool", "GuessEnvironment", "GuessTool", "ReflectingAgent",
            "ToolAgentEngineWrapper"} <= set(checked)  # fmt: skip
    for name, reward_fn in REWARDS.items():
        check_reward(reward_fn, what=f"reward {name}")
    check_tool(CalculatorTool(), what="tools[0]")  # an instance, as the harness holds it


# ---- end to end: a training config ----------------------------------------------------------------------------


def test_a_training_config_with_a_broken_environment_fails_in_the_plan_step(user_module, tmp_path):
    """`plan_run`, what a run does before any output folder or engine, refuses the config: nothing is started."""
    module = user_module(
        "user_train_env",
        """
        class GuessEnv(Environment):
            async def reset(self, request): ...
            def step(self, sample):
                return None, True, {}
    """,
    )
    config = TrainConfig(environment=f"{module}:GuessEnv", tools=[], data="arithmetic:train:8",
                         output_dir=str(tmp_path / "run"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"environment 'user_train_env:GuessEnv': `GuessEnv.step` is a plain def; "
                                          r"the harness awaits it: make it `async def`"):  # fmt: skip
        plan_run(config, 0, 1, None)
    assert not (tmp_path / "run").exists()
