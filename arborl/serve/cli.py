"""``arborl serve CHECKPOINT [--host H] [--port N] [--name ID] [--device auto|cpu|cuda]``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``arborl`` subcommands (imports nothing heavy)."""
    p = sub.add_parser("serve", help="serve a checkpoint over an OpenAI-compatible HTTP API (docs/serve.md)")
    p.add_argument("checkpoint", help="Hugging Face checkpoint directory, e.g. RUN/policy/rl")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (0 picks a free one; default 8000)")
    p.add_argument("--name", help="model id clients pass as `model` (default: the checkpoint directory's name)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest for tiny models)")
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    """Load the checkpoint and serve it until SIGTERM (exit 0) or Ctrl-C (exit 130); prints the URL once it listens."""
    import torch

    from arborl.config import ConfigError
    from arborl.serve.app import PolicyServer
    from arborl.serve.engine import ServedModel

    if args.threads < 1:
        raise ConfigError(f"--threads is {args.threads}; use a positive integer")
    torch.set_num_threads(args.threads)
    try:
        served = ServedModel(args.checkpoint, name=args.name, device=args.device)
    except ValueError as e:  # a bad --device or a checkpoint without a chat template
        raise ConfigError(str(e)) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with PolicyServer(served, host=args.host, port=args.port) as server:
        print(f"arborl: serving {served.name} ({served.device}) at {server.base_url}", flush=True)
        while not stop.wait(0.5):
            pass
    print("arborl: server stopped", file=sys.stderr)
    return 0
