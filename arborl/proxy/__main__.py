"""Command line: ``python -m arborl.proxy serve|bench``.

``serve`` runs the proxy in the foreground until Ctrl-C or SIGTERM::

    python -m arborl.proxy serve --config proxy.toml
    python -m arborl.proxy serve --allow '*.wikipedia.org' --mode record --cache web.sqlite --port 8080

Flags override the TOML file's keys. ``bench`` prints the latency table of ``bench.py``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from .config import ProxyConfig
from .server import ProxyServer, ProxyUnavailableError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m arborl.proxy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy in the foreground")
    serve.add_argument("--config", help="TOML file whose keys are ProxyConfig fields")
    serve.add_argument("--mode", choices=("live", "record", "replay"))
    serve.add_argument("--cache", dest="cache_path", help="SQLite cache file (record/replay)")
    serve.add_argument("--allow", action="append", help="domain pattern to allow (repeatable)")
    serve.add_argument("--deny", action="append", help="domain pattern to deny (repeatable)")
    serve.add_argument(
        "--allow-private", action="append", help="host:port exempt from the private-address rule"
    )
    serve.add_argument("--socket", dest="socket_path", help="unix socket path")
    serve.add_argument(
        "--port", dest="tcp_port", type=int, help="also listen on 127.0.0.1:PORT (0: any free)"
    )
    serve.add_argument("--state-dir", help="directory for sockets, log and config (default: a temp dir)")
    bench = sub.add_parser("bench", help="measure proxy latency on this machine")
    bench.add_argument("-n", type=int, default=200, help="requests per path")
    return parser


def _config(args: argparse.Namespace) -> ProxyConfig:
    data: dict[str, Any] = {}
    if args.config:
        data.update(ProxyConfig.from_toml(args.config).to_dict())
    for key in ("mode", "cache_path", "socket_path", "tcp_port", "state_dir"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    for key in ("allow", "deny", "allow_private"):
        if getattr(args, key):
            data[key] = tuple(getattr(args, key))
    return ProxyConfig.from_dict(data)


def _serve(args: argparse.Namespace) -> int:
    config = _config(args)
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    with ProxyServer(config) as proxy:
        info = {"mode": config.mode, "port": proxy.port, "url": proxy.url, "ca_cert": proxy.ca_cert_path}
        if config.unix_socket:
            info["socket"] = proxy.socket_path
        print(json.dumps(info), flush=True)
        try:
            while not stop and proxy.alive:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        if not proxy.alive:
            print(f"proxy exited with code {proxy.returncode}:\n{proxy.log_tail()}", file=sys.stderr)
            return 1
        print(json.dumps(proxy.stats()), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        from . import bench

        print(f"{'path':<10} {'p50 ms':>8} {'p90 ms':>8}")
        for path, row in bench.run(args.n).items():
            print(f"{path:<10} {row['p50_ms']:>8.2f} {row['p90_ms']:>8.2f}")
        return 0
    except (ProxyUnavailableError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
