"""Helpers of the docker/wasm backend tests (a uniquely named module: test dirs share sys.path)."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest


def need(reason: str) -> None:
    """Skip with ``reason``, or fail under ``ARBORL_REQUIRE_SERVICES=1``."""
    if os.environ.get("ARBORL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"ARBORL_REQUIRE_SERVICES=1 but {reason}")
    pytest.skip(reason)


def docker_cli(host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "--host", host, *args], capture_output=True, text=True, timeout=60, check=False)


class FakeProxy:
    """A unix-socket HTTP server that answers every request with ``proxied: <request line>``."""

    def __init__(self, path: str) -> None:
        import socket
        import threading

        self.path = path
        self.requests: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)  # the sandbox user (65534) must be able to connect
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                data = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
                        data += chunk
                line = data.split(b"\r\n", 1)[0].decode(errors="replace")
                self.requests.append(line)
                body = f"proxied: {line}".encode()
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                with contextlib.suppress(OSError):
                    conn.sendall(head + body)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


# Builtins that site adds and snippets use (the interpreters run with -S): exit code 3, then 4.
SITE_BUILTINS = ("print(callable(help))\nexit(3)", "quit(4)")
