"""Entry point of the proxy process, run by the proxy venv's Python (never imported by arborl).

    <proxy-venv>/bin/python arborl/proxy/proxy_main.py --config STATE_DIR/config.json [--watch-stdin]

It runs mitmproxy (as a library, ``DumpMaster`` without console output) in regular proxy mode on
``127.0.0.1`` with :class:`addon.ArborlAddon`, plus, on the same event loop:

* a unix-socket listener whose connections are handed to mitmproxy's regular-mode server exactly
  like its TCP connections (mitmproxy 11 cannot listen on a unix socket by itself); this socket
  is what a sandbox gets bind-mounted;
* an admin unix socket (mode 0600, never bind-mounted) that answers ``stats`` with JSON.

When everything listens it prints one line ``ARBORL_PROXY_READY {json}`` on stdout. With
``--watch-stdin`` it exits when stdin reaches EOF, i.e. when the parent that spawned it dies.

The sibling modules are loaded as a private package by file path, so neither ``arborl`` (and
whatever its ``__init__`` imports) nor the main venv is needed here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import stat
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_PKG = "_arborl_proxy_runtime"
READY_PREFIX = "ARBORL_PROXY_READY "


def _load_addon_module() -> types.ModuleType:
    # A script's directory is sys.path[0]; drop it so e.g. `cache.py` cannot shadow a real package.
    if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
        sys.path.pop(0)
    pkg = types.ModuleType(_PKG)
    pkg.__path__ = [str(_HERE)]
    sys.modules[_PKG] = pkg
    return importlib.import_module(f"{_PKG}.addon")


class _LoopbackWriter:
    """A unix-socket ``StreamWriter`` that reports loopback TCP addresses.

    mitmproxy's connection handler reads ``peername``/``sockname`` as ``(host, port)`` tuples; a
    unix socket has none, so these report the proxy's own loopback address instead. Everything
    else is delegated to the real writer.
    """

    def __init__(self, writer: asyncio.StreamWriter, sockname: tuple[str, int]):
        self._writer = writer
        self._info = {"peername": ("127.0.0.1", 0), "sockname": sockname, "transport_protocol": "tcp"}

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in self._info:
            return self._info[name]
        return self._writer.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class Runtime:
    """Unix-socket front door and admin socket, started from mitmproxy's ``running`` hook.

    Args:
        cfg: The config dict (``ProxyConfig.to_dict``).
        addon: The policy addon whose counters the admin socket reports.
    """

    def __init__(self, cfg: dict[str, Any], addon: Any):
        self.cfg, self.addon = cfg, addon
        self.state_dir = Path(cfg["state_dir"])
        self.socket_path = cfg["socket_path"] if cfg["unix_socket"] else None
        self.admin_path = str(self.state_dir / "admin.sock")
        self.port = 0
        self._instance: Any = None  # mitmproxy's regular-mode server instance
        self._servers: list[asyncio.base_events.Server] = []
        self._created: list[str] = []  # socket files this process made (and removes at exit)

    async def _handoff(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Hand the unix-socket stream straight to mitmproxy's regular-mode server, as if it had
        # arrived on its TCP port: no extra hop, no loopback TCP in between.
        await self._instance.handle_stream(reader, _LoopbackWriter(writer, ("127.0.0.1", self.port)))

    async def _admin(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            command = (await reader.readline()).decode().strip()
            if command == "stats":
                reply: Any = self.addon.snapshot()
            elif command == "ping":
                reply = "pong"
            else:
                reply = {"error": f"unknown command {command!r}; use 'stats' or 'ping'"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    async def _unix_server(self, path: str, handler: Any, mode: int) -> None:
        # Remove a stale socket from a crashed run, but never some other file at that path.
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        server = await asyncio.start_unix_server(handler, path)
        os.chmod(path, mode)
        self._servers.append(server)
        self._created.append(path)

    async def running(self) -> None:
        """mitmproxy hook: its servers listen now; open ours and announce readiness."""
        from mitmproxy import ctx

        addrs = ctx.master.addons.get("proxyserver").listen_addrs()
        self.port = int(addrs[0][1])
        self._instance = next(iter(ctx.master.addons.get("proxyserver").servers))
        if self.socket_path:
            await self._unix_server(self.socket_path, self._handoff, int(self.cfg["socket_mode"]))
        await self._unix_server(self.admin_path, self._admin, 0o600)
        confdir = Path(self.cfg["confdir"])
        ready = {
            "port": self.port,
            "socket": self.socket_path,
            "admin": self.admin_path,
            "ca_cert": str(confdir / "mitmproxy-ca-cert.pem"),
            "pid": os.getpid(),
        }
        sys.stdout.write(READY_PREFIX + json.dumps(ready) + "\n")
        sys.stdout.flush()

    async def done(self) -> None:
        """mitmproxy hook: stop listening and remove our socket files."""
        for server in self._servers:
            server.close()
        for path in self._created:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self.addon.cache is not None:
            self.addon.cache.close()


def _configure(master: Any, cfg: dict[str, Any]) -> None:
    # Most options are declared by mitmproxy's addons, so they exist only once the master has them.
    master.options.update(
        listen_host="127.0.0.1",
        listen_port=int(cfg["tcp_port"] or 0),
        confdir=cfg["confdir"],
        mode=["regular"],
        # mitmproxy checks this limit before any hook runs and answers 413/502 itself. Set it at
        # twice the larger cap so the addon's exact per-direction caps (with a clearer message)
        # apply first, while memory stays bounded for bodies that lie about their size.
        body_size_limit=str(2 * max(int(cfg["max_request_body"]), int(cfg["max_response_body"]))),
        # Replay must not open upstream connections, not even for a CONNECT.
        connection_strategy="lazy" if cfg["mode"] == "replay" else "eager",
        ignore_hosts=[] if cfg["https_intercept"] else [".*"],
        ssl_insecure=False,
        ssl_verify_upstream_trusted_ca=cfg["upstream_ca"],
    )


async def serve(cfg: dict[str, Any], watch_stdin: bool) -> None:
    """Run mitmproxy with the arborl addon until SIGTERM/SIGINT (or stdin EOF if watched)."""
    from mitmproxy import options
    from mitmproxy.tools.dump import DumpMaster

    addon_mod = _load_addon_module()
    addon = addon_mod.ArborlAddon(addon_mod.Settings.from_config(cfg))
    master = DumpMaster(options.Options(), with_termlog=False, with_dumper=False)
    _configure(master, cfg)
    master.addons.add(addon, Runtime(cfg, addon))
    loop = asyncio.get_running_loop()
    addon.install_resolver_guard(loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, master.shutdown)
    if watch_stdin:

        def wait_for_eof() -> None:
            sys.stdin.buffer.read()
            master.shutdown()

        threading.Thread(target=wait_for_eof, name="parent-watch", daemon=True).start()
    await master.run()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the config JSON, run the proxy."""
    parser = argparse.ArgumentParser(description="arborl filtering, caching proxy process")
    parser.add_argument("--config", required=True, help="config JSON written by ProxyServer")
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (parent died)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    with open(args.config) as f:
        cfg = json.load(f)
    try:
        asyncio.run(serve(cfg, args.watch_stdin))
    except SystemExit as exc:  # mitmproxy's errorcheck addon exits this way on startup errors
        return exc.code if isinstance(exc.code, int) else 1
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Sockets and the cache are closed by now (done hook). Skip interpreter teardown: it waits
    # about a second on mitmproxy's helper threads, and after a failed start it can hang on them.
    os._exit(code)
