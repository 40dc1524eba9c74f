"""A small MCP server for the adapter tests: ``python mcp_server.py stdio`` or ``... http PORT``."""

from __future__ import annotations

import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("arborl-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@server.tool()
def fail(reason: str) -> str:
    """Always raise."""
    raise ValueError(f"refused: {reason}")


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
