"""HTTPS through the proxy: interception with the proxy CA, record, then replay with no upstream.

The upstream is a loopback TLS server with a throwaway certificate for ``secure.test``, made with
the ``openssl`` CLI; the proxy trusts it through ``upstream_ca`` and the client trusts the proxy's
CA (``ProxyServer.ca_cert_path``), exactly as a sandbox would via ``SSL_CERT_FILE``.
"""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proxy_helpers import Handler, Upstream

from arborl.proxy import ProxyServer


@pytest.fixture
def tls_upstream(tmp_path: Path) -> Iterator[tuple[Upstream, str]]:
    """A counting HTTPS server on 127.0.0.1 for the name ``secure.test``, and its cert path."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed; needed to make the test upstream's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=secure.test",
         "-addext", "subjectAltName=DNS:secure.test"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = Upstream()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, str(cert)
    server.shutdown()
    server.server_close()


def _fetch_https(proxy_url: str, url: str, ca_cert: str) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=ca_cert)
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": proxy_url}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=15) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_https_record_then_replay(
    start_proxy: Callable[..., ProxyServer], tls_upstream: tuple[Upstream, str], tmp_path: Path
) -> None:
    upstream, upstream_cert = tls_upstream
    port = upstream.server_address[1]
    fields = {
        "allow": ("secure.test",),
        "resolve": {"secure.test": "127.0.0.1"},
        "allow_private": (f"secure.test:{port}",),
        "upstream_ca": upstream_cert,
        "cache_path": str(tmp_path / "tls.sqlite"),
        "tcp_port": 0,
    }
    url = f"https://secure.test:{port}/doc?b=1&a=2"
    recorder = start_proxy(mode="record", **fields)
    assert _fetch_https(recorder.url, url, recorder.ca_cert_path) == (200, b"upstream saw /doc?b=1&a=2")
    assert upstream.hits == 1
    recorder.stop()

    replayer = start_proxy(mode="replay", **fields)
    assert _fetch_https(replayer.url, url, replayer.ca_cert_path) == (200, b"upstream saw /doc?b=1&a=2")
    status, body = _fetch_https(replayer.url, f"https://secure.test:{port}/other", replayer.ca_cert_path)
    assert status == 504 and b"GET https://secure.test:" in body
    assert upstream.hits == 1  # neither the CONNECT nor the requests inside it reached upstream
    stats = replayer.stats()
    assert (stats["cache_hits"], stats["upstream_connections"]) == (1, 0)


def test_https_without_the_proxy_ca_fails_verification(
    start_proxy: Callable[..., ProxyServer], tls_upstream: tuple[Upstream, str]
) -> None:
    upstream, upstream_cert = tls_upstream
    port = upstream.server_address[1]
    proxy = start_proxy(
        allow=("secure.test",),
        resolve={"secure.test": "127.0.0.1"},
        allow_private=(f"secure.test:{port}",),
        upstream_ca=upstream_cert,
        tcp_port=0,
    )
    # The client trusts only the upstream's own cert, not the proxy CA: interception is visible.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _fetch_https(proxy.url, f"https://secure.test:{port}/", upstream_cert)
    assert upstream.hits == 0


_ = (Handler, http.server)  # the upstream's handler lives in proxy_helpers
