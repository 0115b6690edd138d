"""OpenAI-compatible access to a set of engines: one `OpenAIServing` per engine, served over HTTP on demand.

`EngineServers` owns the serving objects and their server threads: the same logic is reachable in-process
(`completions[i]`, `acompletions[i]`, without HTTP) and over HTTP once `start()` has run (`addresses`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentic_rl.engine.base import Engine
from agentic_rl.errors import ConfigError
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.server.thread import ServerThread
from agentic_rl.types import StepTrajectory

__all__ = ["EngineServers"]


class EngineServers:
    """One `OpenAIServing` per engine, and (after `start`) one HTTP server thread per serving.

    Args:
        engines: the engines to serve, in order; index `i` of every list below refers to `engines[i]`.
        tokenizer: the `transformers` tokenizer of the engines' model.
        model_name: the name clients send as `model`.
    """

    def __init__(self, engines: Sequence[Engine], tokenizer: Any, *, model_name: str) -> None:
        if not engines:
            raise ConfigError("no engines to serve: call initialize() first")
        self.servings = [OpenAIServing(engine, tokenizer, model_name=model_name) for engine in engines]
        self._threads: list[ServerThread] = []

    def start(self, *, host: str = "127.0.0.1", ports: Sequence[int] | None = None) -> list[str]:
        """Serve each engine over HTTP on `host`, one port per engine (0 = a free port). Idempotent.

        Returns:
            `addresses`.

        Raises:
            EngineError: if a server does not come up.
        """
        from agentic_rl.server.app import create_app  # FastAPI is imported only when something is served

        if self._threads:
            return self.addresses
        ports = list(ports) if ports is not None else [0] * len(self.servings)
        for serving, port in zip(self.servings, ports, strict=True):
            thread = ServerThread(create_app(serving), host=host, port=port)
            thread.start()
            self._threads.append(thread)
        return self.addresses

    def stop(self) -> None:
        """Stop the HTTP servers. Idempotent."""
        for thread in self._threads:
            thread.stop()
        self._threads.clear()

    @property
    def addresses(self) -> list[str]:
        """`"IP:PORT"` of each engine's server ([] before `start`)."""
        return [thread.address for thread in self._threads]

    @property
    def acompletions(self) -> list[Callable[..., Any]]:
        """`await acompletions[i](request, trajectory_id=None)`: the server's logic for engine `i`, without HTTP."""
        return [serving.handle for serving in self.servings]

    def completion(self, index: int) -> Callable[..., dict[str, Any]]:
        """A blocking `complete(request, trajectory_id=None) -> response` for engine `index`.

        With a server running it runs on the server's loop; otherwise on a new loop. Inside a running event loop it
        raises `ConfigError` (use `acompletions`). Invalid requests raise `RequestError` (`.status` 400/404).
        """
        serving = self.servings[index]

        def complete(request: dict[str, Any], trajectory_id: str | None = None) -> dict[str, Any]:
            coro = serving.handle(request, trajectory_id=trajectory_id)
            if index < len(self._threads):
                return self._threads[index].run_coroutine(coro)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(coro)
            coro.close()
            raise ConfigError("completions[i] blocks; inside an event loop use `await acompletions[i](request)`")

        return complete

    def captured_trajectory(self, trajectory_id: str, *, engine_index: int = 0, pop: bool = True) -> StepTrajectory:
        """The trajectory recorded from calls tagged with `trajectory_id` on engine `engine_index`.

        Raises:
            KeyError: if no call was captured under that id.
        """
        return self.servings[engine_index].recorder.build(trajectory_id, pop=pop)
