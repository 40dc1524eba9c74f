"""The MCP adapter against a real MCP server (tests/tools/mcp_server.py) over stdio and streamable HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from arborl.env import Task, ToolEnv, check_env  # noqa: E402
from arborl.tools import CALCULATOR, ErrorResult  # noqa: E402
from arborl.tools.mcp_client import MCPError, MCPTools  # noqa: E402

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stdio_server():
    with MCPTools.stdio(sys.executable, [SERVER, "stdio"], call_timeout_s=1.0) as server:
        yield server


@pytest.fixture(scope="module")
def http_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the MCP test server did not listen on port {port}") from None
                time.sleep(0.1)
        with MCPTools.http(f"http://127.0.0.1:{port}/mcp", call_timeout_s=1.0, prefix="web_") as server:
            yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _check_server(server: MCPTools, prefix: str) -> None:
    tools = {t.name: t for t in server.tools()}
    assert sorted(tools) == [prefix + n for n in ("add", "fail", "shout", "slow")]
    add = tools[prefix + "add"]
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer" and add.parameters["required"] == ["a", "b"]
    assert add({"a": 2, "b": 3}) == "5" and not isinstance(add({"a": 2, "b": 3}), ErrorResult)
    assert tools[prefix + "shout"]({"text": "hi"}) == "HI"
    failed = tools[prefix + "fail"]({"reason": "no"})
    assert isinstance(failed, ErrorResult) and "fail" in failed
    t0 = time.perf_counter()
    late = tools[prefix + "slow"]({"seconds": 5})
    assert late == "TimeoutError: MCP tool slow did not answer within 1 s" and time.perf_counter() - t0 < 3
    assert add({"a": 1, "b": 1}) == "2"  # the session survives a timed-out call

    # the server's tools in a tool table, through the env: schema checks happen before the call
    env = ToolEnv([Task("What is 2 + 3?", answer="5")], [CALCULATOR, *tools.values()],
                  lambda a, t: float(a == t.answer))
    env.reset(seed=0)
    res = env.step(f'<tool_call>{json.dumps({"name": prefix + "add", "arguments": {"a": 2, "b": 3}})}</tool_call>')
    assert env.format_observation(res.obs) == "<tool_response>\n5\n</tool_response>"
    assert res.info["tool_stats"] == {prefix + "add": {"calls": 1, "errors": 0, "timeouts": 0}}
    bad = env.step(f'<tool_call>{json.dumps({"name": prefix + "add", "arguments": {"a": "2", "b": 3}})}</tool_call>')
    assert bad.info["action_valid"] is False and "argument 'a' must be integer" in bad.info["error"]
    check_env(env)


def test_stdio_server_tools(stdio_server):
    _check_server(stdio_server, "")


def test_streamable_http_server_tools(http_server):
    _check_server(http_server, "web_")


def test_a_server_that_does_not_start_is_one_clear_error():
    with pytest.raises(MCPError, match=r"failed to connect \(.+\); check that the command runs"):
        MCPTools.stdio(sys.executable, ["-c", "import sys; sys.exit(3)"], connect_timeout_s=5)
    with pytest.raises(MCPError, match=r"failed to connect \(.*Connect"):
        MCPTools.http(f"http://127.0.0.1:{_free_port()}/mcp", connect_timeout_s=5)
    with pytest.raises(MCPError, match="did not connect within 1 s"):  # a process that never speaks MCP
        MCPTools.stdio(sys.executable, ["-c", "import time; time.sleep(30)"], connect_timeout_s=1)


def test_calls_after_close_are_error_results():
    server = MCPTools.stdio(sys.executable, [SERVER, "stdio"])
    (add, *_) = server.tools()
    server.close()
    server.close()
    out = add({"a": 1, "b": 2})
    assert isinstance(out, ErrorResult) and "closed" in out
    with pytest.raises(MCPError, match="not connected"):
        server.tools()
