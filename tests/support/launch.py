"""Helpers for tests that start several ranks: free ports on the loopback interface."""

from __future__ import annotations

import socket


def free_port_pair() -> int:
    """A free loopback port P whose P + 1 is free too (a launcher's store, and a store one port up).

    Raises:
        RuntimeError: if 50 tries found no such pair.
    """
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        try:
            with socket.socket() as b:
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")
