"""The parent's side of the sandbox worker's frame protocol: deadline-bounded reads and writes of one frame.

A frame is a 4-byte big-endian length (`agentic_rl.tools.sandbox_worker.HEADER`, the one definition of the format)
followed by that many bytes of UTF-8 JSON. The worker keeps its own blocking reader and writer, because it runs
isolated (``python -I``) and imports nothing but the standard library; this module holds the parent's, which
`SandboxTool` uses on the worker's non-blocking pipes: every read and write gives up at a `time.monotonic`
deadline, and a reply is checked (size cap, JSON object) before it is trusted.
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from typing import Any

from agentic_rl.tools import sandbox_worker

__all__ = ["ProtocolError", "read_frame", "write_frame"]

_HEADER = sandbox_worker.HEADER  # the frame format is the worker's


class ProtocolError(Exception):
    """The worker sent something that is not a valid frame (too large, not JSON, not a JSON object)."""


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if not poller.poll(max(1, math.ceil(remaining * 1000))):
            continue
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def read_frame(fd: int, deadline: float, max_bytes: int) -> dict[str, Any]:
    """Reads one frame from the worker's stdout.

    Args:
        fd: the read end of the worker's stdout pipe.
        deadline: `time.monotonic` time, in seconds, by which the whole frame must have arrived.
        max_bytes: largest accepted frame body, in bytes.

    Returns:
        The frame's decoded JSON object.

    Raises:
        TimeoutError: if the frame is not complete by `deadline`.
        EOFError: if the pipe closes before the frame is complete.
        ProtocolError: if the frame is over `max_bytes`, not UTF-8 JSON, or not a JSON object.
    """
    (length,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes (limit {max_bytes})")
    try:
        message = json.loads(_read_exact(fd, length, deadline))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"malformed frame: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def write_frame(fd: int, message: dict[str, Any], deadline: float) -> None:
    """Writes `message` as one frame to the worker's stdin (lone surrogates in strings pass through).

    Args:
        fd: the non-blocking write end of the worker's stdin pipe.
        message: the JSON object to send, e.g. ``{"code": ...}``.
        deadline: `time.monotonic` time, in seconds, by which the whole frame must be written.

    Raises:
        TimeoutError: if the frame is not written by `deadline`.
        OSError: if the pipe is broken (`BrokenPipeError` when the worker is gone).
    """
    body = json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
    view = memoryview(_HEADER.pack(len(body)) + body)
    poller = select.poll()
    poller.register(fd, select.POLLOUT | select.POLLERR)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if not poller.poll(max(1, math.ceil(remaining * 1000))):
            continue
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
