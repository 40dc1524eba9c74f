"""Probes: no network egress except the proxy socket the caller passes in."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbutil import LIMITS, require, run_ok

from arborl.sandbox import Sandbox


class Listener:
    """A host-side server socket that counts the connections it accepts."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.accepted = 0
        sock.listen(16)
        sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@contextlib.contextmanager
def listening(family: int, address: object) -> Iterator[Listener]:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind(address)
    listener = Listener(sock)
    try:
        yield listener
    finally:
        listener.close()


CONNECT = """
import json, socket
res = {}
def attempt(name, family, addr):
    try:  # family by name: a backend may lack AF_UNIX/AF_INET6 entirely (wasm), which is a refusal
        s = socket.socket(getattr(socket, family), socket.SOCK_STREAM)
        s.settimeout(1.0)
        s.connect(addr)
        res[name] = "connected"
    except Exception as e:
        res[name] = type(e).__name__
"""


def test_dns_lookup_fails(sandbox: Sandbox) -> None:
    require(sandbox, "network")
    out = run_ok(
        sandbox,
        """
import socket
try:
    print("RESOLVED", socket.getaddrinfo("pypi.org", 443))
except Exception as e:
    print("FAILED", type(e).__name__)
""",
    )
    assert out.startswith("FAILED"), out


def test_tcp_to_outside_address_fails(sandbox: Sandbox) -> None:
    require(sandbox, "network")
    code = (
        CONNECT + 'attempt("v4", "AF_INET", ("1.1.1.1", 443)); attempt("v4dns", "AF_INET", ("8.8.8.8", 53))\n'
    )
    res = json.loads(run_ok(sandbox, code + "print(json.dumps(res))"))
    assert "connected" not in res.values(), res


def test_tcp_to_host_loopback_listener_fails(sandbox: Sandbox) -> None:
    require(sandbox, "network")
    with listening(socket.AF_INET, ("127.0.0.1", 0)) as lst:
        port = lst.sock.getsockname()[1]
        code = CONNECT + f'attempt("lo", "AF_INET", ("127.0.0.1", {port}))\nprint(json.dumps(res))'
        res = json.loads(run_ok(sandbox, code))
    assert res["lo"] != "connected" and lst.accepted == 0, (res, lst.accepted)


def test_ipv6_loopback_listener_unreachable(sandbox: Sandbox) -> None:
    require(sandbox, "network")
    if not socket.has_ipv6:
        pytest.skip("host has no IPv6")
    try:
        ctx = listening(socket.AF_INET6, ("::1", 0))
        lst = ctx.__enter__()
    except OSError as exc:
        pytest.skip(f"host cannot listen on ::1 ({exc})")
    try:
        port = lst.sock.getsockname()[1]
        code = CONNECT + f'attempt("v6", "AF_INET6", ("::1", {port}))\nprint(json.dumps(res))'
        res = json.loads(run_ok(sandbox, code))
    finally:
        ctx.__exit__(None, None, None)
    assert res["v6"] != "connected" and lst.accepted == 0, (res, lst.accepted)


def test_host_abstract_unix_socket_unreachable(sandbox: Sandbox) -> None:
    require(sandbox, "network")
    name = "\0arborl-probe-" + secrets.token_hex(6)
    with listening(socket.AF_UNIX, name) as lst:
        code = CONNECT + f'attempt("abstract", "AF_UNIX", {name!r})\nprint(json.dumps(res))'
        res = json.loads(run_ok(sandbox, code))
    assert res["abstract"] != "connected" and lst.accepted == 0, (res, lst.accepted)


def test_host_filesystem_unix_socket_unreachable(sandbox: Sandbox) -> None:
    require(sandbox, "host_files")
    d = tempfile.mkdtemp(prefix="arborl-sock-", dir="/run" if os.access("/run", os.W_OK) else None)
    os.chmod(d, 0o777)
    path = os.path.join(d, "admin.sock")
    try:
        with listening(socket.AF_UNIX, path) as lst:
            os.chmod(path, 0o666)
            code = CONNECT + f'attempt("path", "AF_UNIX", {path!r})\nprint(json.dumps(res))'
            res = json.loads(run_ok(sandbox, code))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.rmdir(d)
    assert res["path"] != "connected" and lst.accepted == 0, (res, lst.accepted)


class FakeProxy:
    """A unix-socket 'proxy' that answers every HTTP request with the request line it saw."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o666)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(2.0)
                data = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                line = data.split(b"\r\n", 1)[0].decode(errors="replace")
                self.requests.append(line)
                body = f"proxied: {line}".encode()
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                with contextlib.suppress(OSError):
                    conn.sendall(head.encode() + body)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def fake_proxy() -> Iterator[FakeProxy]:
    d = tempfile.mkdtemp(prefix="arborl-proxy-")
    os.chmod(d, 0o711)
    proxy = FakeProxy(str(Path(d) / "proxy.sock"))
    yield proxy
    proxy.close()
    os.unlink(proxy.path)
    os.rmdir(d)


def test_proxy_socket_is_the_only_way_out(backend_name: str, fake_proxy: FakeProxy) -> None:
    if backend_name not in ("bwrap", "zygote", "process"):
        pytest.skip(f"proxy wiring of {backend_name!r} is tested by its own suite")
    code = """
import json, os, socket, urllib.request
res = {"env": os.environ.get("HTTP_PROXY")}
res["body"] = urllib.request.urlopen("http://example.invalid/probe?x=1", timeout=5).read().decode()
try:
    socket.create_connection(("1.1.1.1", 80), timeout=1)
    res["direct"] = "connected"
except OSError as e:
    res["direct"] = type(e).__name__
print(json.dumps(res))
"""
    with Sandbox(backend_name, LIMITS, proxy_socket=fake_proxy.path) as sb:
        res = json.loads(run_ok(sb, code))
    assert res["env"] == "http://127.0.0.1:3128"
    assert res["body"] == "proxied: GET http://example.invalid/probe?x=1 HTTP/1.1"
    assert fake_proxy.requests == ["GET http://example.invalid/probe?x=1 HTTP/1.1"]
    assert res["direct"] != "connected"
