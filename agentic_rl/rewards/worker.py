"""The worker program of `agentic_rl.rewards.pool`: one persistent Python process that scores answers.

`RewardProcessPool` runs this file by path, ``[sys.executable, <this file>, <JSON config>]``; the config holds the
parent's ``sys.path`` and the modules to import before the worker answers ``("ready",)``. It then reads one request
at a time, ``(target, args)``, and answers ``("ok", value)`` or ``("error", "<Type>: <message>")``. ``target`` is a
scorer of this file (``"math_verify"``) or a function named ``"package.module:function"``. Frames are a 4-byte
big-endian length followed by that many bytes of pickle, on the process's original stdin and stdout; the program
moves those away first, so whatever the scored code prints goes to stderr and never into a frame.

Constraints: the program imports only the standard library and what it is asked to (never `agentic_rl`, whose
import pulls in torch: a worker starts in about a second), and importing it has no side effects (`main` runs only
under ``__name__ == "__main__"``), so tests import its scorers directly. A scorer runs in the main thread, so
math-verify runs without its signal-based timeouts all the same: the parent bounds every request by killing the
worker, which is the only bound a C-level loop cannot ignore.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

HEADER = struct.Struct(">I")
"""The frame header: the body's length in bytes, big-endian."""


def write_frame(fd: int, value: Any) -> None:
    """Write `value` pickled, behind its length, to the blocking file descriptor `fd`."""
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


def read_exactly(fd: int, n: int) -> bytes:
    """`n` bytes from the blocking file descriptor `fd`.

    Raises:
        EOFError: if the other end closed before `n` bytes came.
    """
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError("the other end of the reward worker's pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    """The next pickled value on `fd` (see `write_frame`).

    Raises:
        EOFError: if the other end closed.
    """
    (size,) = HEADER.unpack(read_exactly(fd, HEADER.size))
    return pickle.loads(read_exactly(fd, size))


def math_verify_score(prediction: str, gold: Sequence[str]) -> float:
    """1.0 when math-verify finds `prediction` equal to the first spelling of `gold` that parses, else 0.0.

    Raises:
        ValueError: if no spelling of the ground truth parses (the message quotes the last one).
    """
    from math_verify import parse, verify

    gold_parsed = next((parsed for text in gold if (parsed := parse(text, parsing_timeout=None))), None)
    if not gold_parsed:
        raise ValueError(f"cannot parse the ground truth {gold[-1]!r}")
    predicted = parse(prediction, parsing_timeout=None)
    if not predicted:
        return 0.0
    return 1.0 if verify(gold_parsed, predicted, timeout_seconds=None) else 0.0


SCORERS: dict[str, Callable[..., Any]] = {"math_verify": math_verify_score}
"""The scorers of this file, by target name."""


def resolve_target(target: str, cache: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """A scorer of this file, or the function `"package.module:function"` (imported once, then cached).

    Raises:
        ImportError, AttributeError: if the function cannot be imported.
    """
    if target in SCORERS:
        return SCORERS[target]
    if target not in cache:
        module_name, _, attr = target.partition(":")
        fn: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
        cache[target] = fn
    return cache[target]


def _exit_with_parent(parent: int) -> None:
    """Exit as soon as the parent process is gone (a worker busy in Python code notices within a second)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def serve(requests: int, replies: int) -> None:
    """Answer every request read from `requests` on `replies` until the parent closes `requests`."""
    cache: dict[str, Callable[..., Any]] = {}
    while True:
        try:
            target, args = read_frame(requests)
        except EOFError:
            return
        try:
            reply: tuple[Any, ...] = ("ok", resolve_target(target, cache)(*args))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            write_frame(replies, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # a return value that cannot be pickled
            write_frame(replies, ("error", f"the result cannot be sent back: {type(exc).__name__}: {exc}"))


def main() -> None:
    """Take the protocol pipes off stdin/stdout, import the preloads, answer `("ready",)`, then serve."""
    config = json.loads(sys.argv[1])
    sys.path[:] = config["sys_path"]
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # what scored code prints goes to stderr
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it then ends its workers
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call made without its timeouts
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    for name in config["preload"]:
        importlib.import_module(name)
    write_frame(replies, ("ready",))
    serve(requests, replies)


if __name__ == "__main__":
    main()
