"""Tools of any Model Context Protocol server, as arborl :class:`~arborl.tools.base.Tool` s.

::

    with MCPTools.stdio("python", ["my_server.py"]) as server:      # or MCPTools.http(url)
        env = ToolEnv(tasks, [CALCULATOR, *server.tools()], reward)

:class:`MCPTools` holds one connection through the ``mcp`` SDK (``pip install arborl[mcp]``):
a subprocess over stdio, or a streamable-HTTP endpoint. The SDK is asynchronous and arborl's
env steps are not, so the connection lives on its own event loop in a daemon thread; each
tool call is submitted to that loop and waited for with a deadline. A tool error
(``isError``), a protocol error, a dropped connection or a missed deadline becomes
:class:`~arborl.tools.base.ErrorResult` text, so a server that misbehaves costs its call, not
the episode. The tools' ``parameters`` are the server's input schemas, checked by the tool env
before each call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Sequence
from typing import Any

from arborl.tools.base import ErrorResult

_IMPORT_HINT = "the MCP adapter needs the `mcp` package: pip install 'arborl[mcp]'"


class MCPError(RuntimeError):
    """The MCP server could not be reached or listed; the message names the server and the fix."""


class MCPTool:
    """One tool of an MCP server (made by :meth:`MCPTools.tools`).

    Attributes:
        name: Name in the tool table (the server's name, with the connection's prefix).
        description: The server's description.
        parameters: The server's JSON input schema.
        remote_name: The name the server knows the tool by.
    """

    def __init__(self, server: MCPTools, remote_name: str, name: str, description: str,
                 parameters: dict[str, Any]) -> None:
        self.server, self.remote_name, self.name = server, remote_name, name
        self.description, self.parameters = description, parameters

    def __call__(self, arguments: dict[str, Any]) -> str:
        """Call the tool on the server; every failure is result text."""
        return self.server.call(self.remote_name, arguments)

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r})"


class MCPTools:
    """A live connection to one MCP server and the tools it offers.

    Args:
        server: What ``mcp.Client`` connects to: a URL (streamable HTTP) or
            ``mcp.client.stdio.StdioServerParameters``. :meth:`stdio` and :meth:`http` build it.
        call_timeout_s: Deadline of one tool call (the tool env adds its own around it).
        connect_timeout_s: Deadline of connecting and of listing tools.
        prefix: Put before every tool name (``"fs_"``), to keep two servers' names apart.

    Raises:
        MCPError: The server did not start or answer within ``connect_timeout_s``.
    """

    def __init__(self, server: Any, *, call_timeout_s: float = 30.0, connect_timeout_s: float = 30.0,
                 prefix: str = "") -> None:
        try:
            from mcp import Client
        except ImportError as exc:  # an optional extra
            raise MCPError(_IMPORT_HINT) from exc
        self.call_timeout_s, self.connect_timeout_s, self.prefix = call_timeout_s, connect_timeout_s, prefix
        self._label = server if isinstance(server, str) else " ".join([server.command, *server.args])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._client: Any = None
        self._closing: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._holder = asyncio.run_coroutine_threadsafe(self._hold(Client(server), ready), self._loop)
        try:
            ready.result(timeout=connect_timeout_s)
        except BaseException as exc:
            self.close()
            if isinstance(exc, concurrent.futures.TimeoutError):
                what = f"did not connect within {connect_timeout_s:g} s"
            else:
                leaf = _first_leaf(exc)
                what = f"failed to connect ({type(leaf).__name__}: {leaf})"
            raise MCPError(f"MCP server {self._label!r} {what}; check that the command runs "
                           "(or the URL answers) on its own") from exc

    @classmethod
    def stdio(cls, command: str, args: Sequence[str] = (), *, env: dict[str, str] | None = None,
              cwd: str | None = None, **kwargs: Any) -> MCPTools:
        """Start ``command args...`` and speak MCP over its stdin/stdout (``kwargs``: as the constructor)."""
        try:
            from mcp.client.stdio import StdioServerParameters
        except ImportError as exc:
            raise MCPError(_IMPORT_HINT) from exc
        return cls(StdioServerParameters(command=command, args=list(args), env=env, cwd=cwd), **kwargs)

    @classmethod
    def http(cls, url: str, **kwargs: Any) -> MCPTools:
        """Connect to a streamable-HTTP MCP endpoint, e.g. ``http://127.0.0.1:8000/mcp``."""
        return cls(url, **kwargs)

    async def _hold(self, client: Any, ready: concurrent.futures.Future[None]) -> None:
        """Enter the client's context, serve until :meth:`close`, and leave it in the same task."""
        self._closing, self._task = asyncio.Event(), asyncio.current_task()
        try:
            async with client:
                self._client = client
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._client = None

    async def _stop(self) -> None:
        """End the holder task: let it leave the session, or cancel it while it is still connecting."""
        task = self._task
        if task is None or task.done():
            return
        if self._client is not None and self._closing is not None:
            self._closing.set()
        else:
            task.cancel()
        await asyncio.wait({task}, timeout=10)

    def _run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def tools(self) -> list[MCPTool]:
        """The server's tools, as arborl tools.

        Raises:
            MCPError: Listing failed (the message says why).
        """
        if self._client is None:
            raise MCPError(f"MCP server {self._label!r} is not connected (closed?); open a new MCPTools")
        try:
            listing = self._run(self._client.list_tools(), self.connect_timeout_s)
        except Exception as exc:
            raise MCPError(f"MCP server {self._label!r}: listing tools failed: {type(exc).__name__}: {exc}") from exc
        return [MCPTool(self, t.name, self.prefix + t.name, t.description or "", dict(t.input_schema))
                for t in listing.tools]

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call tool ``name`` (the server's name) and return its text; failures are :class:`ErrorResult`."""
        if self._client is None:
            return ErrorResult(f"MCPError: the connection to {self._label!r} is closed")
        future = asyncio.run_coroutine_threadsafe(self._client.call_tool(name, arguments), self._loop)
        try:
            result = future.result(timeout=self.call_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return ErrorResult(f"TimeoutError: MCP tool {name} did not answer within {self.call_timeout_s:g} s")
        except Exception as exc:  # protocol errors, a dead server
            return ErrorResult(f"MCPError: {type(exc).__name__}: {exc}")
        text = _content_text(result)
        return ErrorResult(text) if result.is_error else text

    def close(self) -> None:
        """Leave the session (the stdio server process exits) and stop the loop thread (idempotent)."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(BaseException):  # best effort: the server may already be gone
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> MCPTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside (anyio task groups wrap the real cause)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _content_text(result: Any) -> str:
    """Text of a CallToolResult: its text blocks, then structured content, then other blocks by type."""
    parts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    others = [f"[{block.type} content]" for block in result.content if getattr(block, "type", None) != "text"]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts + others) if parts or others else "[no content]"
