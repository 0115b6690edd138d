"""Run the HTTP server on 127.0.0.1 in a background thread with its own event loop."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentic_rl.errors import EngineError

__all__ = ["ServerThread"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ServerThread:
    """uvicorn serving `app` on `host:port` (port 0 picks a free one) until `stop()`.

    Attributes:
        address: `"IP:PORT"` once started.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"agentic-rl-server-{self.port}", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._started.set()
        await self._server.serve(sockets=[self._socket])

    def start(self, timeout_s: float = 30.0) -> None:
        """Start serving; returns once the server accepts connections.

        Raises:
            EngineError: if the server does not come up within `timeout_s`.
        """
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise EngineError(f"server thread on {self.address} did not start")
        for _ in range(int(timeout_s * 100)):
            if self._server.started:
                logger.info("serving on http://%s", self.address)
                return
            if not self._thread.is_alive():
                break
            threading.Event().wait(0.01)
        raise EngineError(f"server on {self.address} did not start")

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the server's event loop from another thread and wait for its result."""
        if self._loop is None or not self._thread.is_alive():
            coro.close()
            raise EngineError("server is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and join the thread. Idempotent."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._socket.close()
