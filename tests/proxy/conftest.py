"""Fixtures for the proxy tests: a counting loopback upstream and proxies started per test."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest
from proxy_helpers import Upstream

from arborl.proxy import ProxyConfig, ProxyServer, ProxyUnavailableError, proxy_python


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """An HTTP server on 127.0.0.1 that counts every request it answers."""
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def proxy_venv() -> str:
    """The proxy venv's python; skips (or fails under ARBORL_REQUIRE_SERVICES=1) when missing."""
    try:
        return str(proxy_python())
    except ProxyUnavailableError as exc:
        if os.environ.get("ARBORL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"ARBORL_REQUIRE_SERVICES=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def start_proxy(proxy_venv: str) -> Iterator[Callable[..., ProxyServer]]:
    """Start proxies with ``start_proxy(**config_fields)``; all are stopped at the end of the test."""
    started: list[ProxyServer] = []

    def start(**fields: object) -> ProxyServer:
        server = ProxyServer(ProxyConfig(**fields)).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
