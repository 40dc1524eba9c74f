"""Tool-call overheads: a ToolEnv step around the calculator, and one MCP call over stdio and HTTP.

Prints microseconds per ``ToolEnv.step`` with one calculator call (parse, schema check, a
thread with a deadline, render) next to the calculator's own evaluation, and milliseconds per
call of the ``add`` tool of ``tests/tools/mcp_server.py`` over stdio and streamable HTTP on a
loopback port (needs ``arborl[mcp]``).

Usage: ``python bench/tools.py [--steps 2000] [--calls 100]``
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from arborl.env import Task, ToolEnv
from arborl.tools import CALCULATOR
from arborl.tools.calculator import evaluate

SERVER = str(Path(__file__).resolve().parents[1] / "tests" / "tools" / "mcp_server.py")
EXPR = "(1250 - 1000) / 1000 * 100"


def env_step_us(steps: int) -> tuple[float, float]:
    env = ToolEnv([Task("q", "1")], [CALCULATOR], lambda a, t: 1.0, max_steps=steps + 1)
    env.reset(seed=0)
    act = f'<tool_call>{json.dumps({"name": "calculator", "arguments": {"expression": EXPR}})}</tool_call>'
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(act)
    step = (time.perf_counter() - t0) / steps * 1e6
    t0 = time.perf_counter()
    for _ in range(steps):
        evaluate(EXPR)
    return step, (time.perf_counter() - t0) / steps * 1e6


def mcp_call_ms(server, calls: int) -> float:
    add = {t.name: t for t in server.tools()}["add"]
    add({"a": 1, "b": 2})  # warm up
    t0 = time.perf_counter()
    for i in range(calls):
        assert add({"a": i, "b": 1}) == str(i + 1)
    return (time.perf_counter() - t0) / calls * 1e3


def _http_server() -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("the MCP test server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    step, calc = env_step_us(args.steps)
    print(f"ToolEnv.step, one calculator call: {step:8.0f} us   (calculator alone {calc:.0f} us)")
    from arborl.tools.mcp_client import MCPTools

    with MCPTools.stdio(sys.executable, [SERVER, "stdio"]) as server:
        print(f"MCP call over stdio:               {mcp_call_ms(server, args.calls):8.2f} ms")
    proc, port = _http_server()
    try:
        with MCPTools.http(f"http://127.0.0.1:{port}/mcp") as server:
            print(f"MCP call over streamable HTTP:     {mcp_call_ms(server, args.calls):8.2f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
