"""What the harness and the trainer call on a user's environment, tools, agent and reward, checked before anything
runs: one home for those contracts, used when a config is loaded (`loop.sources.load_classes`, `loop.rewards`) and
where the Python API takes them (`ToolAgentEngineWrapper`, `Rollout`).

Each check looks at signatures only (`inspect.signature(...).bind(...)` of the arguments the caller passes), never
calls the user's code, and refuses:

- a method the caller awaits that is a plain `def` (it would fail every trajectory with "object NoneType can't
  be used in 'await' expression"), or a method called without awaiting that is `async def` (it would never run);
- a method that cannot take the arguments the caller passes (`reset(self)` for `reset(request)`);
- a constructor that does not take the config's keyword arguments, or needs one nobody gives;
- a tool whose `parameters` is not a JSON schema the engine's grammar can follow (`tools.schema.schema_problem`,
  the check the OpenAI-compatible server applies to requests).

`*args` / `**kwargs` signatures, `functools.partial`, decorated methods (`functools.wraps`), objects with an
`async def __call__`, and a plain `def` annotated to return an awaitable all pass.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError
from agentic_rl.tools.base import StatefulTool
from agentic_rl.tools.schema import schema_problem

__all__ = ["check_agent", "check_constructor", "check_environment", "check_reward", "check_tool", "check_tools"]


@dataclass(frozen=True, slots=True)
class _Call:
    """One call the caller makes: the method, the arguments it passes (positionally, named as the contract names
    them), and whether it awaits the result (True), calls it plainly (False) or takes either (None)."""

    method: str
    args: tuple[str, ...]
    awaited: bool | None


_ENVIRONMENT = (
    _Call("reset", ("request",), True),
    _Call("step", ("sample",), True),
    _Call("close", ("sample",), True),
    _Call("aclose", (), True),
)
_TOOL = (_Call("execute", ("arguments",), None), _Call("aclose", (), True))
_STATEFUL_TOOL = (
    _Call("session_start", ("session_id",), None),
    _Call("execute_session", ("session_id", "arguments"), None),
    _Call("session_end", ("session_id",), None),
    _Call("aclose", (), True),
)
_AGENT = (
    _Call("initialize", (), False),
    _Call("set_sampling", ("sampling_params",), False),
    _Call("use_engine", ("engine", "renderer"), False),
    _Call("generate_trajectory", ("task", "idx"), True),
    _Call("generate_agent_trajectories_async", ("tasks",), None),
    _Call("close", (), True),
)
_AWAITABLE_RETURN = re.compile(r"\b(Awaitable|Coroutine|Future|Task)\b")
_SELF = object()  # stands for the instance when a method is looked up on a class


def check_environment(environment: Any, *, what: str = "environment", path: str | None = None) -> None:
    """Check what the harness calls on an environment (a class or an instance): `await reset(request)`,
    `await step(sample)`, `await close(sample)` and `await aclose()`; for a `ToolEnvironment` instance, its tools too.

    Args:
        environment: the class or the instance.
        what: the entry or argument that names it, for the message (`environment`, `spec.environment`).
        path: the `package.module:Name` the config wrote, if any.

    Raises:
        ConfigError: naming `what`, the class, the method and what is wrong.
    """
    _check_calls(environment, _ENVIRONMENT, what=what, path=path, caller="harness")
    if isinstance(environment, ToolEnvironment):
        for name, tool in environment.tools.items():
            check_tool(tool, what=f"{what}.tools[{name!r}]")


def check_tools(tools: Sequence[Any], *, what: str = "tools") -> None:
    """`check_tool` of each tool (class or instance), named `what[i]`.

    Raises:
        ConfigError: for the first tool that breaks the contract.
    """
    for i, tool in enumerate(tools):
        check_tool(tool, what=f"{what}[{i}]")


def check_tool(tool: Any, *, what: str, path: str | None = None) -> None:
    """Check what the environment calls on a tool (a class or an instance): `execute(arguments)` (or, for a
    `StatefulTool`, `session_start(session_id)`, `execute_session(session_id, arguments)` and
    `session_end(session_id)`), each a plain or an `async def`; `await aclose()`; and that `parameters` is a JSON
    schema object the engine's grammar can follow (`schema_problem`).

    Args:
        tool: the class or the instance.
        what: the entry or argument that names it (`tools[1]`).
        path: the `package.module:Name` the config wrote, if any.

    Raises:
        ConfigError: naming `what`, the class, the method or `parameters`, and what is wrong.
    """
    cls = tool if isinstance(tool, type) else type(tool)
    calls = _STATEFUL_TOOL if issubclass(cls, StatefulTool) else _TOOL
    _check_calls(tool, calls, what=what, path=path, caller="environment")
    parameters = inspect.getattr_static(tool, "parameters", None)
    if isinstance(parameters, (property, staticmethod, classmethod)) or callable(parameters):
        return  # computed: known only on an instance
    if not isinstance(parameters, dict):
        raise ConfigError(
            f"{_label(what, _qualified(cls), path)}: `{cls.__qualname__}.parameters` must be a JSON schema object (a dict), "
            f"got {type(parameters).__name__}"
        )
    problem = schema_problem(parameters)
    if problem is not None:
        raise ConfigError(
            f"{_label(what, _qualified(cls), path)}: `{cls.__qualname__}.parameters` is not a JSON schema the engine can follow "
            f"(the OpenAI-compatible server refuses it too): {problem}"
        )


def check_agent(agent: Any, *, what: str = "agent", path: str | None = None) -> None:
    """Check what the trainer calls on a `BaseEngineWrapper` (a class or an instance): `initialize()`,
    `set_sampling(sampling_params)` and `use_engine(engine, renderer)` called plainly; `await
    generate_trajectory(task, idx)`, `generate_agent_trajectories_async(tasks)` (plain or `async def`) and
    `await close()`.

    Raises:
        ConfigError: naming `what`, the class, the method and what is wrong.
    """
    _check_calls(agent, _AGENT, what=what, path=path, caller="trainer")


def check_reward(reward_fn: Any, *, what: str = "reward", path: str | None = None) -> None:
    """Check a reward as the harness calls it: `reward_fn(task, messages)`, a plain or an `async def` callable.

    Raises:
        ConfigError: naming `what`, the callable and what is wrong (not callable, or cannot take the two arguments).
    """
    label = _label(what, _qualified(reward_fn), path)
    if not callable(reward_fn):
        raise ConfigError(f"{label}: a reward must be callable as reward_fn(task, messages)")
    if isinstance(reward_fn, type):
        raise ConfigError(f"{label} is a class: give a function (or an instance), called as reward_fn(task, messages)")
    shown = _qualified(reward_fn).rsplit(".", 1)[-1] if inspect.isfunction(reward_fn) else _name(reward_fn)
    _check_bind(reward_fn, ("task", "messages"), label=label, shown=shown, caller="harness")


def check_constructor(
    cls: type,
    *,
    what: str,
    path: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    given: Iterable[str] = (),
    caller: str = "trainer",
) -> None:
    """Check that `cls(**given_values, **kwargs)` can bind: every keyword of `kwargs` (the config's) and of `given`
    (the names the caller passes itself) is taken, and every required argument is among them.

    Raises:
        ConfigError: naming `what`, the unknown arguments and the ones the class takes, or the missing ones.
    """
    signature = _constructor_signature(cls)
    if signature is None:
        return
    kwargs = dict(kwargs or {})
    parameters = signature.parameters
    label = _label(what, _qualified(cls), path)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        known = ", ".join(n for n, p in parameters.items() if p.kind is not p.VAR_POSITIONAL) or "none"
        unknown = sorted(set(kwargs) - set(parameters))
        if unknown:
            raise ConfigError(f"{label} takes no argument(s) {', '.join(unknown)} (it takes: {known})")
        passed = [n for n in given if n not in parameters]
        if passed:
            raise ConfigError(
                f"{label}: the constructor `{cls.__qualname__}{signature}` cannot take {', '.join(passed)}, which "
                f"the {caller} passes: add them as parameters (or **kwargs)"
            )
    names = {**dict.fromkeys(given), **kwargs}
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError as exc:
        required = [
            n
            for n, p in parameters.items()
            if p.default is p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        missing = [n for n in required if n not in names] or [str(exc)]
        where = f"{what}.kwargs" if path is not None else "the call"
        raise ConfigError(
            f"{label}: the constructor `{cls.__qualname__}{signature}` needs {', '.join(missing)}, which neither "
            f"the {caller} nor {where} gives: add {'it' if len(missing) == 1 else 'them'} to {where}"
        ) from None


def _constructor_signature(cls: type) -> inspect.Signature | None:
    """The signature `cls(...)` binds against: `__init__`'s when the class's own is a catch-all `__new__`
    (`*args, **kwargs`); None when Python cannot read it (let the constructor decide)."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return None
    catch_all = all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values())
    if catch_all and signature.parameters and cls.__init__ is not object.__init__:
        try:
            init = inspect.signature(cls.__init__)
        except (TypeError, ValueError):
            return signature
        return init.replace(parameters=list(init.parameters.values())[1:])
    return signature


def _check_calls(owner: Any, calls: Sequence[_Call], *, what: str, path: str | None, caller: str) -> None:
    """Check each of `calls` on `owner` (a class: looked up as an instance would see it; or an instance)."""
    cls = owner if isinstance(owner, type) else type(owner)
    label = _label(what, _qualified(cls), path)
    for call in calls:
        method = _method(owner, call.method)
        shown = f"{cls.__qualname__}.{call.method}"
        if method is None:
            raise ConfigError(
                f"{label}: `{shown}` is missing; the {caller} calls {call.method}({', '.join(call.args)})"
            )
        if method is _UNKNOWN:
            continue
        if call.awaited is True and not _is_async(method):
            raise ConfigError(f"{label}: `{shown}` is a plain def; the {caller} awaits it: make it `async def`")
        if call.awaited is False and _is_async(method):
            raise ConfigError(
                f"{label}: `{shown}` is `async def`; the {caller} calls it without awaiting (it would never run): "
                "make it a plain def"
            )
        _check_bind(method, call.args, label=label, shown=shown, caller=caller)


_UNKNOWN = object()  # an attribute whose callable cannot be known without an instance (a property, ...)


def _method(owner: Any, name: str) -> Any:
    """What `instance.name` is (bound: without `self`); None when missing, `_UNKNOWN` when it cannot be told."""
    if not isinstance(owner, type):
        return getattr(owner, name, None)
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        return None
    if isinstance(raw, property):
        return _UNKNOWN
    if not hasattr(type(raw), "__get__"):
        return raw  # a callable object (e.g. functools.partial) stored on the class: called as it is
    try:
        return raw.__get__(_SELF, owner)
    except Exception:  # a descriptor that needs a real instance
        return _UNKNOWN


def _is_async(fn: Any) -> bool:
    """Whether calling `fn` gives an awaitable: a coroutine function (also behind `functools.partial`, a bound
    method or a `functools.wraps` decorator), an object whose `__call__` is one, or a plain def annotated to return
    an awaitable."""
    try:
        unwrapped = inspect.unwrap(fn)
    except ValueError:  # a __wrapped__ cycle
        unwrapped = fn
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(unwrapped):
        return True
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and inspect.iscoroutinefunction(type(fn).__call__):
        return True
    try:
        returns = inspect.signature(fn).return_annotation
    except (TypeError, ValueError):
        return False
    return returns is not inspect.Signature.empty and bool(_AWAITABLE_RETURN.search(str(returns)))


def _check_bind(fn: Any, args: tuple[str, ...], *, label: str, shown: str, caller: str) -> None:
    """Refuse `fn` when it cannot take `args` positionally."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        signature.bind(*args)
    except TypeError:
        written = f"{shown}{_signature_with_self(fn, signature)}"
        if not args:
            wrong = f"cannot be called with no arguments, as the {caller} calls it"
        else:
            names = " and ".join(args)
            wrong = f"cannot take the {names} argument{'s' if len(args) > 1 else ''} the {caller} passes"
        raise ConfigError(f"{label}: `{written}` {wrong} ({shown.rsplit('.', 1)[-1]}({', '.join(args)}))") from None


def _signature_with_self(fn: Any, signature: inspect.Signature) -> inspect.Signature:
    """The signature as the user wrote it: with `self` for a method."""
    func = getattr(fn, "__func__", None)
    if inspect.ismethod(fn) and func is not None:
        try:
            return inspect.signature(func)
        except (TypeError, ValueError):
            pass
    return signature


def _name(obj: Any) -> str:
    """How a callable is written: a function's or class's `__qualname__`, else its class's."""
    name = getattr(obj, "__qualname__", None)
    return name if isinstance(name, str) else type(obj).__qualname__


def _qualified(obj: Any) -> str:
    """`module.Qualname` of a class or function; of its class for anything else (a partial, a callable object)."""
    target = obj if isinstance(obj, type) or inspect.isfunction(obj) or inspect.ismethod(obj) else type(obj)
    return f"{getattr(target, '__module__', '?')}.{_name(target)}"


def _label(what: str, qualified: str, path: str | None) -> str:
    """`what 'package.module:Name'` (from a config), or `what (module.Qualname)`."""
    if path is not None:
        return f"{what} {path!r}"
    return f"{what} ({qualified})"
