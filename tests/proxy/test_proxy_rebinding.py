"""DNS rebinding: a name that resolves to a public address at check time and to 127.0.0.1 at connect time.

There is no DNS here, so a scripted resolver stands in for the attacker's name server: its first
answer is public, every later one is loopback. The addon's resolver guard is installed on top of
it, exactly as the proxy process installs it on top of the event loop's real ``getaddrinfo``, and
the connect goes through ``asyncio.open_connection``, the call mitmproxy uses for upstreams.
The script runs in the proxy venv because the addon imports mitmproxy.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from proxy_helpers import Upstream

import arborl.proxy
from arborl.proxy import ProxyConfig

SCRIPT = r"""
import asyncio, json, socket, sys
sys.path.insert(0, sys.argv[1])
import proxy_main
addon_mod = proxy_main._load_addon_module()
cfg, port = json.loads(sys.argv[2]), int(sys.argv[3])
addon = addon_mod.ArborlAddon(addon_mod.Settings.from_config(cfg))
answers = []

async def attacker_dns(host, port, *args, **kwargs):
    ip = "93.184.216.34" if not answers else "127.0.0.1"
    answers.append(ip)
    return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))]

async def main():
    loop = asyncio.get_running_loop()
    loop.getaddrinfo = attacker_dns
    addon.install_resolver_guard(loop)
    decision, _ = await addon._check_destination("rebind.example", port)
    try:
        await asyncio.wait_for(asyncio.open_connection("rebind.example", port), 5)
        connect = "connected"
    except OSError as exc:
        connect = str(exc)
    print(json.dumps({"check_allowed": decision.allowed, "connect": connect, "answers": answers}))

asyncio.run(main())
"""


def test_rebinding_between_check_and_connect_cannot_reach_loopback(
    proxy_venv: str, upstream: Upstream
) -> None:
    port = upstream.server_address[1]
    cfg = ProxyConfig(allow=("*",)).to_dict()
    proxy_dir = str(Path(arborl.proxy.__file__).parent)
    done = subprocess.run(
        [proxy_venv, "-I", "-c", SCRIPT, proxy_dir, json.dumps(cfg), str(port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["check_allowed"] is True  # the first answer looked public
    assert out["answers"] == ["93.184.216.34", "127.0.0.1"]  # the connect resolved again...
    assert "non-public" in out["connect"]  # ...and the guard dropped the loopback answer
    assert upstream.hits == 0
