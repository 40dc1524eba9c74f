"""``arborl view STORE_URL [--run RUN_DIR ...] [--host H] [--port N]``: the trajectory explorer.

Serves :func:`arborl.view.api.create_app` with uvicorn on 127.0.0.1 (``--host`` to change it)
and prints the address. ``--port 0`` takes any free port.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_PORT = 8321


def add_view_command(subparsers: Any) -> None:
    """Add ``view`` to a CLI's subparsers."""
    p = subparsers.add_parser("view", help="explore a trajectory store (and runs' curves) in the browser")
    p.add_argument("url", metavar="STORE_URL", help="e.g. sqlite:///runs/tiny/trajectories.db")
    p.add_argument("--run", action="append", default=[], metavar="RUN_DIR",
                   help="a run directory whose metrics.jsonl to plot (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    """Handler of ``arborl view``: open the store read-only, serve until Ctrl-C."""
    try:
        import uvicorn
    except ImportError:
        print("arborl: error: arborl view needs fastapi and uvicorn; pip install 'arborl[view]'", file=sys.stderr)
        return 2
    from arborl.search.server import bind
    from arborl.store.url import redact
    from arborl.view.api import create_app

    app = create_app(args.url, args.run)
    sock = bind(args.host, args.port, who="arborl view")  # a port in use: ConfigError, one line
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"arborl view: http://{shown}:{port}/  (store {redact(args.url)}; Ctrl-C to stop)", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    return 0
