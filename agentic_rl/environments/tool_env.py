"""An environment that executes the tool calls of each assistant turn and ends on a turn without one."""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import anyio

from agentic_rl.environments.base import INFRASTRUCTURE_ERRORS_KEY, Environment, Sample, StepResult
from agentic_rl.errors import ConfigError, EnvStepError, ToolError, ToolUnavailableError
from agentic_rl.parser import ToolCall, ToolCallError, parse_tool_calls, to_call, tool_call_format
from agentic_rl.tools.base import StatefulTool, Tool
from agentic_rl.tools.prompt import tools_system_prompt

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ToolEnvironment", "ToolReply"]

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves problems step by step. Give the final answer as a number on the last line."
)

MAX_OBSERVATION_CHARS = 8192


class ToolReply(NamedTuple):
    """What one tool call gave (`ToolEnvironment.call_tool`).

    Attributes:
        content: the tool message's content: the result, or "Error: ..." text meant for the model.
        ok: False when the call failed (unknown tool, bad arguments, a failing or slow tool).
        infrastructure: True when the tool's service failed (`ToolUnavailableError`, past its time bound, a crash):
            not the policy's doing, so a trainer should not score the trajectory on it.
    """

    content: str
    ok: bool
    infrastructure: bool


class ToolEnvironment(Environment):
    """Runs the tool calls of the latest assistant message and returns one tool message per call.

    Calls are read as `parser.parse_tool_calls` reads them: JSON (Hermes) or XML (Qwen3-Coder) inside `<tool_call>`,
    Mistral's `[TOOL_CALLS]`, and Llama 3's bare JSON calls when `call_format` is `LLAMA3_JSON`; XML parameter values
    typed by each tool's parameter schema, calls inside `<think>` reasoning ignored. A turn with
    no tool call is the final answer and ends the trajectory. Malformed calls (invalid JSON, no name, unknown tool)
    and failing or slow tools come back to the model as error text; so do arguments that are not a JSON object (a
    plain string, a list), with the parameter schema the tool expected.

    Args:
        tools: the tools offered; names must be unique.
        system_prompt: the system message; a task's own `system_prompt` replaces it for that task. Tool descriptions
            are appended when `tools_in_system_prompt`.
        tools_in_system_prompt: describe the tools in the system prompt (for chat templates that ignore the
            `tools` argument). When False, tools reach the model only through the template's `tools` argument.
        max_observation_chars: each tool result is cut to this many characters, with a marker.
        max_tool_threads: most synchronous tool calls running at once in worker threads.
        call_format: the tool-call format the chat template teaches (`parser.tool_call_format`; `for_renderer` sets
            it from the renderer's template). None: calls are read in the formats read whatever the template.

    Raises:
        ConfigError: if two tools share a name, a tool has no name or is not a `Tool`, or a limit is not a
            positive int.
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        tools_in_system_prompt: bool = True,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
        max_tool_threads: int = 16,
        call_format: str | None = None,
    ) -> None:
        for label, value in [("max_observation_chars", max_observation_chars), ("max_tool_threads", max_tool_threads)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{label} must be an int >= 1, got {value!r}")
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise ConfigError(f"tools must be Tool instances, got {type(tool).__name__}")
            if not tool.name:
                raise ConfigError(f"tool {type(tool).__name__} has no name")
            if tool.name in self.tools:
                raise ConfigError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.system_prompt = system_prompt
        self.tools_in_system_prompt = tools_in_system_prompt
        self.max_observation_chars = max_observation_chars
        self.call_format = call_format
        self._thread_limiter = anyio.CapacityLimiter(max_tool_threads)
        self._sessions: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_renderer(cls, tools: Sequence[Tool], renderer: Any, system_prompt: str | None = None) -> ToolEnvironment:
        """The environment a rollout builds for `tools` under `renderer` (a `chat.ChatRenderer`): the tools are
        described in the system prompt only when the chat template ignores its `tools` argument, and calls are read
        in the format the template teaches (`parser.tool_call_format`).

        Synthesized SFT traces use this too, so that their tokens are the ones the rollout will see.
        `system_prompt` None is `DEFAULT_SYSTEM_PROMPT`.
        """
        return cls(
            tools,
            system_prompt=DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt,
            tools_in_system_prompt=not renderer.supports_tools,
            call_format=tool_call_format(getattr(getattr(renderer, "tokenizer", None), "chat_template", None)),
        )

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    async def reset(self, request: dict[str, Any]) -> Sample:
        question = request.get("question")
        if not isinstance(question, str) or not question.strip():
            raise EnvStepError("task needs a non-empty 'question' string")
        system = self.system_prompt
        own = request.get("system_prompt")  # a task's own system prompt (e.g. a dataset's system message) wins
        if own is not None:
            if not isinstance(own, str):
                raise EnvStepError(f"a task's 'system_prompt' must be a string, got {type(own).__name__}")
            system = own
        if self.tools_in_system_prompt:
            system = tools_system_prompt(system, self.schemas)
        messages = [{"role": "user", "content": question}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        sample_id = str(request.get("trajectory_id", request.get("id", "")))
        return Sample(id=sample_id, task=request, messages=messages, tools=self.schemas)

    async def step(self, sample: Sample) -> StepResult:
        if not sample.messages or sample.messages[-1]["role"] != "assistant":
            raise EnvStepError("step() needs the latest message to be the assistant's")
        calls = parse_tool_calls(sample.messages[-1]["content"], self.schemas, self.call_format)
        if not calls:
            return StepResult([], True, {"tool_calls": 0, "tool_errors": 0, "well_formed_calls": 0})
        observation = []
        errors = 0
        unavailable: list[str] = []  # calls whose tool's service failed: not the policy's doing
        for call in calls:
            if isinstance(call, ToolCall):
                ok, text, infrastructure = await self._run_call(sample, call)
                if infrastructure:
                    unavailable.append(text.removeprefix("Error: "))
            else:
                ok, text = False, f"Error: {call.message}"
            errors += not ok
            observation.append({"role": "tool", "content": self._cap(text)})
        well_formed = sum(isinstance(c, ToolCall) and not c.arguments_error for c in calls)
        info: dict[str, Any] = {"tool_calls": len(calls), "tool_errors": errors, "well_formed_calls": well_formed}
        if unavailable:
            info[INFRASTRUCTURE_ERRORS_KEY] = unavailable
        return StepResult(observation, False, info)

    async def call_tool(self, sample: Sample, name: str, arguments: str | Mapping[str, Any] | None) -> ToolReply:
        """Runs one tool call given the way an OpenAI client receives it, for the trajectory of `sample`.

        For an agent that runs its own tool loop against the OpenAI-compatible server (its model calls captured by
        trajectory id): pass each `tool_calls[i].function.name` and `.arguments` of the reply. The call runs as
        `step` runs the calls it parses: a stateful tool keeps its session per trajectory until `close`, and the
        same error texts come back.

        Args:
            sample: the trajectory, as `reset` returned it.
            name: the tool's name.
            arguments: a JSON-encoded object (OpenAI's form), an object, or None / "" for no arguments.

        Returns:
            a `ToolReply`; its content is cut to `max_observation_chars`. Never raises for a bad call.
        """
        call = to_call({"name": name, "arguments": arguments}, "")
        if isinstance(call, ToolCallError):
            return ToolReply(self._cap(f"Error: {call.message}"), False, False)
        ok, text, infrastructure = await self._run_call(sample, call)
        return ToolReply(self._cap(text), ok, infrastructure)

    async def close(self, sample: Sample) -> None:
        with self._lock:
            names = self._sessions.pop(sample.id, set())
        for name in names:
            tool = self.tools[name]
            assert isinstance(tool, StatefulTool)
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(tool.call_timeout_s):
                    await self._invoke(tool.session_end, sample.id)
            except Exception:
                logger.exception("session_end of tool %s failed for trajectory %s", name, sample.id)

    async def aclose(self) -> None:
        """Close every tool (`Tool.aclose`: HTTP clients and the like), each bounded by its `timeout_s`; failures are
        logged, never raised."""
        for name, tool in self.tools.items():
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(tool.call_timeout_s):
                    await tool.aclose()
            except Exception:
                logger.exception("closing tool %s failed", name)

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_observation_chars:
            return text
        cut = len(text) - self.max_observation_chars
        return text[: self.max_observation_chars] + f"\n...[truncated {cut} characters]"

    async def _invoke(self, fn: Any, *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._thread_limiter)

    async def _run_call(self, sample: Sample, call: ToolCall) -> tuple[bool, str, bool]:
        """`(ok, observation text, whether the tool's service failed)`: a `ToolUnavailableError`, a tool that did
        not return within its own bound, or a tool that crashed are infrastructure failures; an unknown tool, bad
        arguments or a `ToolError` are the policy's."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return False, f"Error: unknown tool {call.name!r}; available tools: {known}", False
        if call.arguments_error:
            expected = json.dumps(tool.parameters, ensure_ascii=False)
            text = f"Error: {call.arguments_error}; {call.name!r} takes a JSON object of arguments: {expected}"
            return False, text, False
        try:
            with anyio.fail_after(tool.call_timeout_s):
                if isinstance(tool, StatefulTool):
                    await self._ensure_session(sample.id, tool)
                    result = await self._invoke(tool.execute_session, sample.id, call.arguments)
                else:
                    result = await self._invoke(tool.execute, call.arguments)
        except TimeoutError:
            return False, f"Error: tool {call.name!r} timed out after {tool.call_timeout_s:g} s", True
        except ToolError as exc:
            return False, f"Error: {exc}", isinstance(exc, ToolUnavailableError)
        except Exception as exc:  # a broken tool: reported, and an infrastructure failure of the trajectory
            logger.warning("tool %s raised %s: %s", call.name, type(exc).__name__, exc)
            return False, f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", True
        if not isinstance(result, str):
            result = json.dumps(result, ensure_ascii=False, default=str)
        return True, result, False

    async def _ensure_session(self, sample_id: str, tool: StatefulTool) -> None:
        with self._lock:
            if tool.name in self._sessions.get(sample_id, ()):
                return
        await self._invoke(tool.session_start, sample_id)  # a failure leaves the session unstarted: retried next call
        with self._lock:
            self._sessions.setdefault(sample_id, set()).add(tool.name)
