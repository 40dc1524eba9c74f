"""The intended wiring, end to end: code inside ``bwrap --unshare-all`` reaches the web only via the proxy.

Inside the sandbox (uid 65534 in a user namespace) there is no network but loopback. The proxy's unix socket is bind-mounted at
``/run/arborl/proxy.sock`` and ``relay.py`` (run by Debian's ``/usr/bin/python3``) serves
``127.0.0.1:3128`` inside. The sandboxed client then tries the host's loopback upstream directly
(must fail: separate network namespace) and through ``HTTP_PROXY`` (must succeed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from proxy_helpers import Upstream

import arborl.proxy.relay as relay_module
from arborl.proxy import ProxyServer

SANDBOX_PYTHON = "/usr/bin/python3"

CLIENT = r"""
import json, sys, threading, time, urllib.request
sys.path.insert(0, "/opt/arborl")
import relay
server = relay.make_server("/run/arborl/proxy.sock", 3128)
threading.Thread(target=server.serve_forever, daemon=True).start()
url, out = sys.argv[1], {}
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    direct.open("http://127.0.0.1:%s/direct" % sys.argv[2], timeout=3)
    out["direct"] = "reached"
except OSError as exc:
    out["direct"] = "failed: %s" % exc
start = time.perf_counter()
with urllib.request.urlopen(url, timeout=15) as resp:  # HTTP_PROXY from the environment
    out["status"], out["body"] = resp.status, resp.read().decode()
out["ms"] = (time.perf_counter() - start) * 1000
try:
    urllib.request.urlopen("http://example.org/", timeout=15)
except urllib.error.HTTPError as err:
    out["blocked"] = err.code
print(json.dumps(out))
"""


def _bwrap_command(sock: str, relay_dir: str, argv: list[str]) -> list[str]:
    return [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--uid", "65534",
        "--gid", "65534",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--dir", "/run/arborl",
        "--bind", sock, "/run/arborl/proxy.sock",
        "--ro-bind", relay_dir, "/opt/arborl",
        "--setenv", "HTTP_PROXY", "http://127.0.0.1:3128",
        "--setenv", "http_proxy", "http://127.0.0.1:3128",
        "--setenv", "NO_PROXY", "",
        *argv,
    ]  # fmt: skip


def _require_sandbox_tools() -> None:
    tools = (
        ("bubblewrap (bwrap)", shutil.which("bwrap") is not None),
        (SANDBOX_PYTHON, os.path.exists(SANDBOX_PYTHON)),
    )
    missing = [what for what, ok in tools if not ok]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed; scripts/setup/proxy.sh installs them"
    if os.environ.get("ARBORL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"ARBORL_REQUIRE_SERVICES=1 but {reason}")
    pytest.skip(reason)


def test_sandboxed_code_reaches_upstream_only_through_the_proxy(
    start_proxy: Callable[..., ProxyServer], upstream: Upstream, tmp_path: Path
) -> None:
    _require_sandbox_tools()
    port = upstream.server_address[1]
    proxy = start_proxy(
        allow=("api.test",), resolve={"api.test": "127.0.0.1"}, allow_private=(f"api.test:{port}",)
    )
    relay_dir = tmp_path / "relay"
    relay_dir.mkdir()
    shutil.copy(relay_module.__file__, relay_dir / "relay.py")  # the file is self-contained
    argv = [SANDBOX_PYTHON, "-I", "-c", CLIENT, f"http://api.test:{port}/from-sandbox", str(port)]
    done = subprocess.run(
        _bwrap_command(proxy.socket_path, str(relay_dir), argv), capture_output=True, timeout=60, text=True
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["direct"].startswith("failed"), out  # no route to the host's loopback
    assert (out["status"], out["body"]) == (200, "upstream saw /from-sandbox")
    assert out["blocked"] == 403
    assert upstream.hits == 1
    assert upstream.paths == ["/from-sandbox"]
