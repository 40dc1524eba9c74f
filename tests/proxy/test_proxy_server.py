"""End-to-end tests of the proxy process: policy, SSRF refusal, record/replay, caps, CONNECT, relay.

Every test starts a real mitmproxy-based proxy (in its own venv) and a counting HTTP upstream on
127.0.0.1; the upstream's counter is the ground truth for "no upstream connection was made".
The upstream sits on loopback, so each test that must reach it names it in ``allow_private``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proxy_helpers import Upstream, fetch

from arborl.proxy import ProxyConfig, ProxyServer, relay

Start = Callable[..., ProxyServer]


def _reach(upstream: Upstream) -> dict[str, object]:
    """Config fields that let 'api.test' (and only it) reach the loopback upstream."""
    port = upstream.server_address[1]
    return {"resolve": {"api.test": "127.0.0.1"}, "allow_private": (f"api.test:{port}",)}


def test_allowlisted_domain_reaches_upstream(start_proxy: Start, upstream: Upstream) -> None:
    proxy = start_proxy(allow=("api.test",), tcp_port=0, **_reach(upstream))
    port = upstream.server_address[1]
    reply = fetch(proxy.url, f"http://api.test:{port}/hello?q=1")
    assert reply.status == 200
    assert reply.body == b"upstream saw /hello?q=1"
    assert upstream.hits == 1
    assert proxy.stats()["upstream_connections"] == 1


def test_domain_not_in_allow_list_gets_403(start_proxy: Start, upstream: Upstream) -> None:
    proxy = start_proxy(allow=("api.test", "*.allowed.test"), tcp_port=0, **_reach(upstream))
    for url in ("http://example.org/", "http://allowed.test/", "http://evilallowed.test/"):
        reply = fetch(proxy.url, url)
        assert reply.status == 403, url
        assert b"not in the allow list" in reply.body
    assert upstream.hits == 0
    stats = proxy.stats()
    assert stats["refused_policy"] == 3
    assert stats["upstream_connections"] == 0


def test_deny_list_wins_over_allow_list(start_proxy: Start, upstream: Upstream) -> None:
    port = upstream.server_address[1]
    proxy = start_proxy(
        allow=("*.test",),
        deny=("secret.test",),
        resolve={"api.test": "127.0.0.1", "secret.test": "127.0.0.1"},
        allow_private=(f"127.0.0.1:{port}",),
        tcp_port=0,
    )
    denied = fetch(proxy.url, f"http://secret.test:{port}/")
    assert denied.status == 403
    assert b"matches deny pattern 'secret.test'" in denied.body
    assert fetch(proxy.url, f"http://api.test:{port}/").status == 200
    assert upstream.hits == 1


@pytest.fixture(scope="module")
def ssrf_setup(proxy_venv: str) -> Iterator[tuple[ProxyServer, Upstream]]:
    """One upstream and one allow-everything proxy shared by the SSRF cases (starting is the slow part)."""
    upstream = Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = upstream.server_address[1]
    # Everything is allowed by domain; only api.test (by name) may use the loopback exception.
    config = ProxyConfig(
        allow=("*",), tcp_port=0, resolve={"rebind.test": "127.0.0.1"}, allow_private=(f"api.test:{port}",)
    )
    with ProxyServer(config) as proxy:
        yield proxy, upstream
    upstream.shutdown()
    upstream.server_close()


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("http://localhost:{port}/", b"127.0.0.1 (loopback)"),  # name from /etc/hosts
        ("http://127.0.0.1:{port}/", b"(loopback)"),
        ("http://[::1]:{port}/", b"(loopback)"),
        ("http://[::ffff:127.0.0.1]:{port}/", b"embeds 127.0.0.1"),
        ("http://0.0.0.0:{port}/", b"(unspecified)"),
        ("http://rebind.test:{port}/", b"resolves to 127.0.0.1"),  # an allowed name pointing inside
        ("http://169.254.169.254/latest/meta-data/", b"cloud metadata"),
        ("http://[fd00:ec2::254]/latest/meta-data/", b"cloud metadata"),
        ("http://10.0.0.1/", b"(private)"),
        ("http://192.168.1.1:8080/", b"(private)"),
    ],
)
def test_non_public_destinations_are_refused_without_connecting(
    ssrf_setup: tuple[ProxyServer, Upstream], target: str, needle: bytes
) -> None:
    proxy, upstream = ssrf_setup
    before = proxy.stats()
    reply = fetch(proxy.url, target.format(port=upstream.server_address[1]), timeout=10)
    assert reply.status == 403
    assert needle in reply.body
    assert b"non-public destinations are refused" in reply.body
    assert upstream.hits == 0
    after = proxy.stats()
    assert after["refused_address"] - before["refused_address"] == 1
    assert after["upstream_connections"] == 0


def test_host_header_must_match_the_request_host(start_proxy: Start, upstream: Upstream) -> None:
    port = upstream.server_address[1]
    proxy = start_proxy(allow=("api.test",), tcp_port=0, **_reach(upstream))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(f"GET http://api.test:{port}/front HTTP/1.1\r\nHost: refused.test\r\n\r\n".encode())
        reply = b""
        while b"match" not in reply:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 403")
    assert b"Host header 'refused.test' does not match the request's host 'api.test'" in reply
    assert fetch(proxy.url, f"http://api.test:{port}/ok").status == 200  # Host: api.test:PORT matches
    assert upstream.paths == ["/ok"]


def test_record_then_replay_serves_same_bodies_with_zero_upstream_hits(
    start_proxy: Start, upstream: Upstream, tmp_path: Path
) -> None:
    port = upstream.server_address[1]
    cache = str(tmp_path / "web.sqlite")
    base = f"http://api.test:{port}"
    recorder = start_proxy(
        allow=("api.test",), mode="record", cache_path=cache, tcp_port=0, **_reach(upstream)
    )
    recorded = {
        "get": fetch(recorder.url, f"{base}/page?b=2&a=1").body,
        "post": fetch(recorder.url, f"{base}/form", data=b"payload-1").body,
    }
    head = fetch(recorder.url, f"{base}/page", method="HEAD")
    assert (head.status, head.body, head.headers["content-length"]) == (
        200,
        b"",
        "18",
    )  # len("upstream saw /page")
    assert recorded["get"] == b"upstream saw /page?b=2&a=1"
    assert upstream.hits == 3
    assert recorder.stats()["recorded"] == 3
    recorder.stop()

    replayer = start_proxy(
        allow=("api.test",), mode="replay", cache_path=cache, tcp_port=0, **_reach(upstream)
    )
    again = fetch(replayer.url, f"{base}/page?b=2&a=1")
    assert again.status == 200
    assert again.body == recorded["get"]
    assert again.headers["x-arborl-proxy"] == "cache-hit"
    assert again.headers["x-upstream"] == "yes"  # upstream headers are replayed too
    assert fetch(replayer.url, f"{base}/page", method="HEAD").headers["content-length"] == "18"
    # The same query in another order is another request (a server may read it in order).
    assert fetch(replayer.url, f"{base}/page?a=1&b=2").status == 504
    assert fetch(replayer.url, f"{base}/form", data=b"payload-1").body == recorded["post"]
    # A different body is a different key: explicit miss, still no upstream.
    miss = fetch(replayer.url, f"{base}/form", data=b"payload-2")
    assert miss.status == 504
    assert b"replay mode and no recorded response for POST http://api.test:" in miss.body
    assert upstream.hits == 3
    stats = replayer.stats()
    assert (stats["cache_hits"], stats["cache_misses"], stats["upstream_connections"]) == (3, 2, 0)


def test_replay_miss_names_the_missing_key_and_connects_nowhere(
    start_proxy: Start, upstream: Upstream, tmp_path: Path
) -> None:
    port = upstream.server_address[1]
    cache = tmp_path / "empty.sqlite"
    recorder = start_proxy(allow=("api.test",), mode="record", cache_path=str(cache), tcp_port=0)
    recorder.stop()  # creates an empty cache file
    proxy = start_proxy(
        allow=("api.test",), mode="replay", cache_path=str(cache), tcp_port=0, **_reach(upstream)
    )
    reply = fetch(proxy.url, f"http://api.test:{port}/missing?z=1&y=2")
    assert reply.status == 504
    assert f"GET http://api.test:{port}/missing?z=1&y=2".encode() in reply.body
    assert b"(key " in reply.body
    assert upstream.hits == 0
    assert proxy.stats()["upstream_connections"] == 0


def test_body_caps(start_proxy: Start, upstream: Upstream) -> None:
    port = upstream.server_address[1]
    proxy = start_proxy(
        allow=("api.test",), tcp_port=0, max_request_body=8000, max_response_body=5000, **_reach(upstream)
    )
    base = f"http://api.test:{port}"
    too_big = fetch(proxy.url, f"{base}/upload", data=b"y" * 8001)
    assert too_big.status == 413
    assert b"exceeds the cap of 8000" in too_big.body
    assert upstream.hits == 0  # refused from the Content-Length, before any upstream contact
    assert fetch(proxy.url, f"{base}/upload", data=b"y" * 8000).status == 200
    assert fetch(proxy.url, f"{base}/big?n=5000").body == b"x" * 5000
    over = fetch(proxy.url, f"{base}/big?n=6000")  # under mitmproxy's hard limit, over ours
    assert over.status == 502
    assert b"response body of 6000 bytes exceeds the cap of 5000" in over.body
    hard = fetch(proxy.url, f"{base}/big?n=20000")  # over mitmproxy's hard limit (2 x 8000) too
    assert hard.status == 502
    assert b"body_size_limit" in hard.body
    assert proxy.stats()["too_large"] == 3


def test_request_budget_and_rate_limit(start_proxy: Start, upstream: Upstream) -> None:
    port = upstream.server_address[1]
    proxy = start_proxy(allow=("api.test",), tcp_port=0, max_requests=2, **_reach(upstream))
    statuses = [fetch(proxy.url, f"http://api.test:{port}/{i}").status for i in range(3)]
    assert statuses == [200, 200, 429]
    assert upstream.hits == 2
    limited = start_proxy(
        allow=("api.test",), tcp_port=0, rate_limit_per_s=0.001, rate_limit_burst=1, **_reach(upstream)
    )
    statuses = [fetch(limited.url, f"http://api.test:{port}/r{i}").status for i in range(2)]
    assert statuses == [200, 429]


def _connect(port: int, authority: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
        while len(body) < int(fields.get(b"content-length", b"0")):
            body += s.recv(4096)
        return lines[0] + b"\n" + body


def test_connect_to_blocked_hosts_is_refused(start_proxy: Start, upstream: Upstream) -> None:
    port = upstream.server_address[1]
    proxy = start_proxy(allow=("*.test",), deny=("bad.test",), tcp_port=0, **_reach(upstream))
    not_allowed = _connect(proxy.port, "example.com:443")
    assert not_allowed.startswith(b"HTTP/1.1 403") and b"not in the allow list" in not_allowed
    denied = _connect(proxy.port, "bad.test:443")
    assert denied.startswith(b"HTTP/1.1 403") and b"deny pattern" in denied
    private = start_proxy(allow=("*",), tcp_port=0, **_reach(upstream))
    for authority in (f"127.0.0.1:{port}", "169.254.169.254:443", f"localhost:{port}"):
        refused = _connect(private.port, authority)
        assert refused.startswith(b"HTTP/1.1 403"), authority
        assert b"non-public destinations are refused" in refused
    assert _connect(private.port, f"api.test:{port}").startswith(b"HTTP/1.1 200")  # the one exception
    assert upstream.hits == 0
    assert proxy.stats()["upstream_connections"] == 0


def test_unix_socket_through_in_sandbox_relay(start_proxy: Start, upstream: Upstream) -> None:
    port = upstream.server_address[1]
    proxy = start_proxy(allow=("api.test",), **_reach(upstream))  # unix socket only
    with pytest.raises(RuntimeError, match="not running|tcp"):
        _ = ProxyServer(proxy.config).url  # not started: no port to report
    server = relay.make_server(proxy.socket_path, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        via = f"http://127.0.0.1:{server.port}"
        reply = fetch(via, f"http://api.test:{port}/via-socket")
        assert (reply.status, reply.body) == (200, b"upstream saw /via-socket")
        assert fetch(via, "http://example.org/").status == 403
    finally:
        server.shutdown()
        server.server_close()
    assert upstream.hits == 1


PARENT = """
import sys, time
from arborl.proxy import ProxyConfig, ProxyServer
proxy = ProxyServer(ProxyConfig(allow=("x.test",))).start()
print(proxy.pid, proxy.config.state_dir, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an exited child nobody has reaped yet)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_proxy_exits_when_its_parent_is_killed(proxy_venv: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    state_dir = ""
    try:
        assert parent.stdout is not None
        pid_s, state_dir = parent.stdout.readline().split()
        pid = int(pid_s)
        assert _running(pid)
        parent.kill()  # SIGKILL: no cleanup code runs in the parent
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), "proxy outlived its parent"
        assert not Path(state_dir, "proxy.sock").exists()  # it shut down in order, removing its socket
    finally:
        parent.kill()
        if state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)


def test_start_failures_are_reported_with_the_cause(proxy_venv: str, tmp_path: Path) -> None:
    keep = tmp_path / "not-a-socket"
    keep.write_text("precious")
    with pytest.raises(FileExistsError, match="is not a socket"):
        ProxyServer(ProxyConfig(allow=("a.test",), socket_path=str(keep))).start()
    assert keep.read_text() == "precious"
    with pytest.raises(FileNotFoundError, match="record one first"):
        ProxyServer(ProxyConfig(mode="replay", cache_path=str(tmp_path / "none.sqlite"))).start()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = ProxyConfig(allow=("a.test",), tcp_port=taken.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"exited with code 1(.|\n)*address already in use"):
            ProxyServer(busy).start()
        assert time.monotonic() - started < busy.start_timeout_s  # failed fast, not by timeout
