"""A counting loopback upstream and a proxy client, shared by the proxy tests."""

from __future__ import annotations

import hashlib
import http.server
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.hits = 0
        self.paths: list[str] = []

    def count(self, path: str) -> None:
        with self.lock:
            self.hits += 1
            self.paths.append(path)


class Handler(http.server.BaseHTTPRequestHandler):
    """GET /big?n=N returns N bytes of 'x'; any other GET echoes the path; POST echoes the body hash."""

    server: Upstream
    protocol_version = "HTTP/1.1"

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Upstream", "yes")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.count(self.path)
        parts = urlsplit(self.path)
        if parts.path == "/big":
            self._send(b"x" * int(parse_qs(parts.query)["n"][0]))
        else:
            self._send(f"upstream saw {self.path}".encode())

    def do_HEAD(self) -> None:
        self.server.count(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(f"upstream saw {self.path}")))
        self.end_headers()

    def do_POST(self) -> None:
        self.server.count(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._send(f"posted {hashlib.sha256(body).hexdigest()}".encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Reply:
    """What a client got back."""

    status: int
    headers: dict[str, str]
    body: bytes


def fetch(
    proxy_url: str,
    url: str,
    data: bytes | None = None,
    timeout: float = 15.0,
    method: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """GET (or POST when ``data`` is given, or ``method``) ``url`` through the HTTP proxy at ``proxy_url``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url}))
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers or {}, method=method), timeout=timeout) as resp:
            return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())
