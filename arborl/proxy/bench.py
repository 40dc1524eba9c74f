"""Latency of the proxy's paths, measured on this machine (stdlib only).

``python -m arborl.proxy bench`` starts a loopback upstream, records one response, then times
``n`` requests per path with a new connection each (as ``urllib`` does):

* ``live``: through the proxy in ``record`` mode to the upstream (policy + resolution + upstream);
* ``hit_tcp``: cache hit in ``replay`` mode via mitmproxy's TCP port;
* ``hit_unix``: cache hit via the unix socket (what a sandbox's bind mount reaches);
* ``hit_relay``: cache hit via ``relay.py`` on loopback TCP in front of the unix socket, which is
  what code inside the sandbox sees;
* ``direct``: the upstream without any proxy, as the baseline.
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from . import relay
from .config import ProxyConfig
from .server import ProxyServer


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b"x" * 2048
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost")
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def _get(make_conn: Callable[[], http.client.HTTPConnection], url: str) -> None:
    conn = make_conn()
    try:
        conn.request("GET", url)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"benchmark request got {resp.status}")
    finally:
        conn.close()


def _time(n: int, fns: dict[str, Callable[[], None]]) -> dict[str, dict[str, float]]:
    """Time each function ``n`` times, interleaved so load from other processes hits all alike."""
    for fn in fns.values():  # warm-up
        for _ in range(min(10, n)):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1000)
    out = {}
    for name, values in samples.items():
        values.sort()
        out[name] = {"p50_ms": statistics.median(values), "p90_ms": values[int(0.9 * (len(values) - 1))]}
    return out


def run(n: int = 200) -> dict[str, dict[str, float]]:
    """Measure every path ``n`` times.

    Args:
        n: Requests per path.

    Returns:
        ``{path: {"p50_ms": ..., "p90_ms": ...}}``.
    """
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = upstream.server_address[1]
    url = f"http://bench.test:{port}/page"
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="arborl-bench-") as tmp:
        common = ProxyConfig(
            allow=("bench.test",),
            resolve={"bench.test": "127.0.0.1"},
            allow_private=(f"bench.test:{port}",),
            tcp_port=0,
            mode="record",
            cache_path=os.path.join(tmp, "bench.sqlite"),
        )
        direct = {"direct": lambda: _get(lambda: http.client.HTTPConnection("127.0.0.1", port), "/page")}
        with ProxyServer(common) as proxy:
            results.update(
                _time(
                    n,
                    {"live": lambda: _get(lambda: http.client.HTTPConnection("127.0.0.1", proxy.port), url)},
                )
            )
        with ProxyServer(common.replace(mode="replay")) as proxy:
            sock = proxy.socket_path
            server = relay.make_server(sock, 0)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            try:
                paths: dict[str, Callable[[], None]] = {
                    "hit_tcp": lambda: _get(lambda: http.client.HTTPConnection("127.0.0.1", proxy.port), url),
                    "hit_unix": lambda: _get(lambda: _UnixHTTPConnection(sock), url),
                    "hit_relay": lambda: _get(
                        lambda: http.client.HTTPConnection("127.0.0.1", server.port), url
                    ),
                }
                results.update(_time(n, {**direct, **paths}))
            finally:
                server.shutdown()
                server.server_close()
    upstream.shutdown()
    upstream.server_close()
    return results
