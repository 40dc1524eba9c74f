"""relay.py on its own: byte-exact piping both ways, half-close, concurrency, and its CLI errors.

Runs without the proxy venv: a stdlib unix-socket server stands in for the proxy end.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from arborl.proxy import relay


@pytest.fixture
def digest_server(tmp_path: Path) -> Iterator[str]:
    """A unix-socket server that reads until EOF, then replies with the sha256 of what it got."""
    path = str(tmp_path / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)

    def serve_one(conn: socket.socket) -> None:
        with conn:
            h = hashlib.sha256()
            while chunk := conn.recv(65536):
                h.update(chunk)
            conn.sendall(h.hexdigest().encode())

    def accept_loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    yield path
    srv.close()


def _roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)  # the half-close must reach the server for it to answer
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_relay_pipes_bytes_exactly_and_passes_half_close(digest_server: str) -> None:
    server = relay.make_server(digest_server, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        payloads = [os.urandom(n) for n in (0, 1, 65535, 65536, 3_000_001)] + [b"x" * 100_000] * 20
        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda p: _roundtrip(server.port, p), payloads))
        assert replies == [hashlib.sha256(p).hexdigest().encode() for p in payloads]
    finally:
        server.shutdown()
        server.server_close()


def test_relay_refuses_a_missing_socket_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="bind-mount"):
        relay.make_server(str(tmp_path / "absent.sock"), 0)


def test_relay_script_usage_errors(tmp_path: Path) -> None:
    script = relay.__file__
    usage = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage: python3 relay.py SOCKET_PATH [PORT]" in usage.stderr
    bad_port = subprocess.run(
        [sys.executable, script, "/x", "http"], capture_output=True, text=True, timeout=30
    )
    assert bad_port.returncode == 2 and "PORT must be an integer" in bad_port.stderr
    missing = subprocess.run(
        [sys.executable, script, str(tmp_path / "absent.sock"), "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr
