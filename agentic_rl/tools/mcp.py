"""MCP servers as tools: a server's tools are offered to the model like built-in ones, and called through the
official `mcp` client.

A `tools:` entry `{"mcp": {...}}` (`MCPToolsEntry`, fields in `MCPServerConfig`) names one server, started as a
command line over stdio (`command`) or reached over streamable HTTP (`url`), and optionally the subset of its tools
to offer (`tools`). `build_mcp_tools` connects once, lists the server's tools (so their JSON schemas are known
before the engine starts) and returns one `MCPTool` per tool; a server that does not start, or does not answer,
fails there with a `ConfigError` naming the command (or URL) and the server's stderr.

Sessions: with `session: per_trajectory` (the default) each trajectory gets its own MCP session (for a stdio
server, its own server process), opened on the trajectory's first call and closed when the trajectory ends, so a
stateful server keeps per-trajectory state. With `session: shared` one session (the one opened for discovery)
serves every trajectory: for servers that say they are stateless.

Every session lives in one background thread's event loop owned by `MCPConnection` (the `mcp` client's transports
are task-bound context managers, so a session is opened and closed by one task there); calls from the rollout's
event loop are handed over and awaited. Failures never hang: a call past `timeout_s`, a server that died, a
malformed result or a tool error (`is_error`) ends that call with a `ToolError` (the environment turns it into an
`Error: ...` observation and counts it in `tool_errors`), and `MCPConnection.errors` counts them by kind. All but a
tool error are the server's failures, not the call's: `ToolUnavailableError`, which ends the trajectory as an
infrastructure failure (retried with a fresh sample, never trained on). Text
content becomes the observation; other content (images, audio, resources) is named, e.g. `[image content:
image/png]`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shlex
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentic_rl.errors import ConfigError, ToolError, ToolUnavailableError
from agentic_rl.tools.base import StatefulTool

__all__ = [
    "MCPConnection",
    "MCPServerConfig",
    "MCPTool",
    "MCPToolsEntry",
    "build_mcp_tools",
    "check_mcp_server",
    "parse_mcp_option",
]

logger = logging.getLogger(__name__)

_SHARED = "\x00shared"  # the session key of a shared session
_CLOSE_S = 10.0  # how long closing one session may take


class MCPServerConfig(BaseModel):
    """One MCP server, as a `tools:` entry's `mcp` value names it.

    Attributes:
        command: the server's command line over stdio (a list, or one string split as a shell would).
        url: the server's streamable HTTP endpoint (e.g. `http://127.0.0.1:8000/mcp`); exactly one of the two.
        tools: the names of the server's tools to offer (None: all of them); an unknown name is an error.
        timeout_s: wall-clock limit of one call, in seconds.
        start_timeout_s: limit on starting a server and opening a session (the handshake), in seconds.
        session: `per_trajectory` (a session per trajectory, for stateful servers) or `shared` (one for all).
        env: environment variables for a stdio server, over the `mcp` client's safe defaults.
        cwd: the working directory of a stdio server.
    """

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = None
    url: str | None = None
    tools: list[str] | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    start_timeout_s: float = Field(default=30.0, gt=0)
    session: Literal["per_trajectory", "shared"] = "per_trajectory"
    env: dict[str, str] | None = None
    cwd: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _split_command(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("command"), str):
            data = {**data, "command": shlex.split(data["command"])}
        return data

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of 'command' (stdio) and 'url' (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError("an MCP server's 'command' is empty")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"an MCP server's 'url' must be http:// or https://, got {self.url!r}")
        return self

    @property
    def label(self) -> str:
        """The command line or the URL, as error messages name the server."""
        return shlex.join(self.command) if self.command is not None else str(self.url)


class MCPToolsEntry(BaseModel):
    """A `tools:` entry naming an MCP server: `{"mcp": {"command": [...]}}` or `{"mcp": {"url": "..."}}`."""

    model_config = ConfigDict(extra="forbid")

    mcp: MCPServerConfig


def parse_mcp_option(text: str) -> MCPToolsEntry:
    """The server a command line's `--mcp` names: a JSON object of `MCPServerConfig` fields
    (`'{"command": ["python", "server.py"], "tools": ["add"]}'`), a URL (`http://127.0.0.1:8000/mcp`), or a command
    line (`'python server.py'`).

    Raises:
        ConfigError: naming the option and what is wrong.
    """
    import json

    from pydantic import ValidationError

    text = text.strip()
    try:
        if text.startswith("{"):
            return MCPToolsEntry(mcp=MCPServerConfig.model_validate(json.loads(text)))
        if text.startswith(("http://", "https://")):
            return MCPToolsEntry(mcp=MCPServerConfig(url=text))
        return MCPToolsEntry(mcp=MCPServerConfig.model_validate({"command": text}))
    except (ValueError, ValidationError) as exc:
        raise ConfigError(f"--mcp {text!r}: {exc}") from None


@dataclass
class _Session:
    """One open MCP session, owned by a task of the connection's loop."""

    client: Any = None
    ready: asyncio.Future[Any] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    stderr: Any = None


class MCPConnection:
    """The sessions of one MCP server, run in a background thread's event loop.

    Args:
        config: the server.

    Attributes:
        errors: failed calls by kind (`timeout`, `server_died`, `malformed`, `tool_error`, `session_failed`).
        calls: calls made.
    """

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.errors: collections.Counter[str] = collections.Counter()
        self.calls = 0
        self._sessions: dict[str, _Session] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._closed = False

    # ------------------------------------------------------------------------------------------- from other threads

    def discover(self) -> list[Any]:
        """The server's tools (`mcp` `Tool` records, every page), from a session opened for it; that session is kept
        when sessions are shared, else closed.

        Raises:
            ConfigError: naming the command or URL (and a stdio server's stderr) when the server does not start or
                does not answer within `start_timeout_s`.
        """
        future = asyncio.run_coroutine_threadsafe(self._discover(), self._loop)
        return future.result()

    async def call(self, session_id: str, name: str, arguments: dict[str, Any]) -> str:
        """Call tool `name` in `session_id`'s session (opened on its first call), from any event loop.

        Raises:
            ToolError: the call failed (timeout, dead server, malformed result, a tool error); counted in `errors`.
        """
        if self._closed:  # its loop has stopped: a call handed to it would never be answered
            raise ToolError(f"tool {name!r}: the MCP client of {self.config.label!r} is closed")
        key = _SHARED if self.config.session == "shared" else session_id
        future = asyncio.run_coroutine_threadsafe(self._call(key, name, arguments), self._loop)
        return await asyncio.wrap_future(future)

    async def end(self, session_id: str) -> None:
        """Close `session_id`'s session (idempotent; shared sessions stay until `close`)."""
        if self.config.session == "shared" or self._closed:
            return
        future = asyncio.run_coroutine_threadsafe(self._end(session_id), self._loop)
        await asyncio.wrap_future(future)

    def close(self) -> None:
        """Close every session and stop the background loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        future = asyncio.run_coroutine_threadsafe(self._end_all(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=_CLOSE_S + 5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------------------------------- in the loop

    async def _discover(self) -> list[Any]:
        key = _SHARED if self.config.session == "shared" else "\x00discovery"
        session = await self._session(key)
        try:
            tools: list[Any] = []
            cursor = None
            async with asyncio.timeout(self.config.start_timeout_s):
                while True:
                    params = None if cursor is None else {"cursor": cursor}
                    page = await session.client.list_tools(params=params)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as exc:
            await self._end(key)
            raise ConfigError(f"MCP server {self.config.label!r}: listing its tools failed: {_describe(exc)}") from None
        if key != _SHARED:
            await self._end(key)
        return tools

    async def _session(self, key: str) -> _Session:
        """The open session of `key`, opened now when it has none (concurrent callers share one opening)."""
        session = self._sessions.get(key)
        if session is None or session.dead.is_set():
            session = _Session(ready=self._loop.create_future())
            self._sessions[key] = session
            session.task = self._loop.create_task(self._own(session))
        assert session.ready is not None
        try:
            async with asyncio.timeout(self.config.start_timeout_s):
                await asyncio.shield(session.ready)
        except TimeoutError:
            session.stop.set()
            if self._sessions.get(key) is session:
                del self._sessions[key]
            raise ConfigError(
                f"MCP server {self.config.label!r} did not start within {self.config.start_timeout_s:g} s"
                + _stderr_tail(session)
            ) from None
        return session

    async def _own(self, session: _Session) -> None:
        """The task that opens `session`'s transport and client, holds them until `stop`, then closes them."""
        from mcp import ClientSession

        assert session.ready is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(session))
                client = await stack.enter_async_context(ClientSession(read, write))
                await client.initialize()
                session.client = client
                session.ready.set_result(None)
                await session.stop.wait()
        except BaseException as exc:  # noqa: BLE001  (reported to whoever waits for the session)
            if not session.ready.done():
                session.ready.set_exception(
                    ConfigError(
                        f"MCP server {self.config.label!r} did not start: {_describe(exc)}{_stderr_tail(session)}"
                    )
                )
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            session.dead.set()
            if session.stderr is not None:
                session.stderr.close()

    def _transport(self, session: _Session) -> Any:
        config = self.config
        if config.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(config.url)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        assert config.command is not None
        session.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        params = StdioServerParameters(
            command=config.command[0], args=config.command[1:], env=config.env, cwd=config.cwd
        )
        return stdio_client(params, errlog=session.stderr)

    async def _call(self, key: str, name: str, arguments: dict[str, Any]) -> str:
        self.calls += 1
        try:
            session = await self._session(key)
        except ConfigError as exc:
            self.errors["session_failed"] += 1
            raise ToolUnavailableError(str(exc)) from None
        call = asyncio.ensure_future(session.client.call_tool(name, arguments))
        died = asyncio.ensure_future(session.dead.wait())
        try:
            done, _ = await asyncio.wait({call, died}, timeout=self.config.timeout_s, return_when="FIRST_COMPLETED")
        finally:
            died.cancel()
            if not call.done():
                call.cancel()
        if call not in done:
            died_first = died in done
            self.errors["server_died" if died_first else "timeout"] += 1
            await self._end(key)  # a dead or stuck server: the next call starts a fresh session
            if died_first:
                raise ToolUnavailableError(f"tool {name!r} failed: the MCP server died")
            raise ToolUnavailableError(f"tool {name!r} timed out after {self.config.timeout_s:g} s")
        try:
            result = call.result()
        except Exception as exc:
            if session.dead.is_set() or "connection closed" in str(exc).lower():
                self.errors["server_died"] += 1
                await self._end(key)  # the next call starts a fresh session (a stdio server's state is lost)
                raise ToolUnavailableError(f"tool {name!r} failed: the MCP server died ({_describe(exc)})") from None
            self.errors["malformed"] += 1
            raise ToolUnavailableError(f"tool {name!r} failed: {_describe(exc)}") from None
        return self._observation(name, result)

    def _observation(self, name: str, result: Any) -> str:
        content = getattr(result, "content", None)
        if not isinstance(content, list):
            self.errors["malformed"] += 1
            raise ToolUnavailableError(f"tool {name!r} returned a malformed result (no content list)")
        parts = [_content_text(block) for block in content]
        if not content and getattr(result, "structured_content", None) is not None:
            import json

            parts = [json.dumps(result.structured_content, ensure_ascii=False, default=str)]
        text = "\n".join(parts)
        if getattr(result, "is_error", False):
            self.errors["tool_error"] += 1
            raise ToolError(f"tool {name!r} failed: {text}")
        return text

    async def _end(self, key: str) -> None:
        session = self._sessions.pop(key, None)
        if session is None or session.task is None:
            return
        session.stop.set()
        try:
            async with asyncio.timeout(_CLOSE_S):
                await asyncio.shield(session.task)
        except (TimeoutError, Exception):
            session.task.cancel()
            logger.warning("closing an MCP session of %s took over %g s: cancelled", self.config.label, _CLOSE_S)

    async def _end_all(self) -> None:
        await asyncio.gather(*(self._end(key) for key in list(self._sessions)), return_exceptions=True)


def _content_text(block: Any) -> str:
    """The text of one content block; other kinds named (`[image content: image/png]`)."""
    kind = getattr(block, "type", type(block).__name__)
    if kind == "text":
        return str(block.text)
    mime = getattr(block, "mime_type", None) or getattr(getattr(block, "resource", None), "mime_type", None)
    return f"[{kind} content{': ' + mime if mime else ''}]"


def _describe(exc: BaseException) -> str:
    """`Type: message`, unwrapping exception groups to their first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _stderr_tail(session: _Session, most: int = 2000) -> str:
    """`; stderr: ...` with the end of a stdio server's stderr, or nothing."""
    stream = session.stderr
    if stream is None or stream.closed:
        return ""
    with contextlib.suppress(Exception):
        stream.flush()
        size = stream.seek(0, os.SEEK_END)
        stream.seek(max(0, size - most))
        text = stream.read().strip()
        return f"; stderr: {text}" if text else "; stderr: (empty)"
    return ""


class MCPTool(StatefulTool):
    """One tool of an MCP server; its schema is the server's `inputSchema`.

    Args:
        connection: the server's sessions (shared by every tool of that server).
        name, description, parameters: from the server's tool list.
    """

    def __init__(self, connection: MCPConnection, name: str, description: str, parameters: dict[str, Any]) -> None:
        self.connection = connection
        self.name = name
        self.description = description
        self.parameters = parameters
        self.timeout_s = connection.config.timeout_s

    @property
    def call_timeout_s(self) -> float:
        """Room for opening a session and the call's own limit (which reports first)."""
        return self.connection.config.start_timeout_s + self.connection.config.timeout_s + 5.0

    def session_start(self, session_id: str) -> None:
        """Nothing: the session opens on the trajectory's first call."""

    async def execute_session(self, session_id: str, arguments: dict[str, Any]) -> str:
        return await self.connection.call(session_id, self.name, arguments)

    async def session_end(self, session_id: str) -> None:
        await self.connection.end(session_id)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.connection.close)


def build_mcp_tools(entry: MCPToolsEntry | MCPServerConfig | dict[str, Any]) -> list[MCPTool]:
    """Connect to the server `entry` names, list its tools and return one `MCPTool` per offered tool.

    Raises:
        ConfigError: a malformed entry; a server that does not start or answer (naming its command or URL and its
            stderr); a name in `tools` the server does not have (naming the ones it has).
    """
    from pydantic import ValidationError

    try:
        if isinstance(entry, dict):
            entry = MCPToolsEntry.model_validate(entry) if "mcp" in entry else MCPServerConfig.model_validate(entry)
    except ValidationError as exc:
        raise ConfigError(f"MCP tool entry: {exc}") from None
    config = entry.mcp if isinstance(entry, MCPToolsEntry) else entry
    connection = MCPConnection(config)
    try:
        listed = connection.discover()
        by_name = {tool.name: tool for tool in listed}
        wanted: Sequence[str] = list(by_name) if config.tools is None else config.tools
        missing = [name for name in wanted if name not in by_name]
        if missing:
            raise ConfigError(
                f"MCP server {config.label!r} has no tool(s) {', '.join(missing)}; it has: {', '.join(by_name)}"
            )
    except BaseException:
        connection.close()
        raise
    if not wanted:
        connection.close()
    return [
        MCPTool(connection, name, by_name[name].description or "", dict(by_name[name].input_schema)) for name in wanted
    ]


def check_mcp_server(entry: MCPToolsEntry | MCPServerConfig | dict[str, Any]) -> list[str]:
    """Start the server `entry` names, list its tools, stop it: a training run's check before its engine starts.

    Returns:
        The names of the tools it would offer.

    Raises:
        ConfigError: as `build_mcp_tools`.
    """
    tools = build_mcp_tools(entry)
    if tools:
        tools[0].connection.close()
    return [tool.name for tool in tools]
