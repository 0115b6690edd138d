"""A small MCP server for the tests, written with the `mcp` package's own server API (`MCPServer`, FastMCP's v2 name).

Run as `python mcp_server.py stdio` or `python mcp_server.py http PORT [--stateless]`. Tools: `add` (sum of two
ints), `echo`, `count` (a counter kept in the process: one per stdio session), `crash` (the process exits at once),
`hang` (never answers), `picture` (an image content block) and `fail` (a tool error).
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("agentic-rl-test")
_counter = {"n": 0}


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def echo(text: str) -> str:
    """Repeat the text."""
    return text


@server.tool()
def count() -> str:
    """Increment this session's counter and return it."""
    _counter["n"] += 1
    return f"{_counter['n']} pid={os.getpid()}"


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep(3600)
    return "late"


@server.tool()
def picture() -> Image:
    """A 1-pixel PNG."""
    return Image(data=b"\x89PNG\r\n\x1a\n", format="png")


@server.tool()
def fail() -> str:
    """Raise an error."""
    raise ValueError("the tool refused")


if __name__ == "__main__":  # fmt: skip
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), stateless_http="--stateless" in sys.argv)
