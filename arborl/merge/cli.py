"""``arborl merge``: merge Hugging Face checkpoints from the command line.

Usage::

    arborl merge --method ties --out DIR CKPT1 CKPT2 [--weights 0.5,0.5] [--base CKPT] [--density 0.5]
"""

from __future__ import annotations

import argparse
from typing import Any


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers, e.g. 0.7,0.3") from None


def _merge(args: argparse.Namespace) -> int:
    from arborl.merge import MergeConfig
    from arborl.merge.checkpoint import merge_checkpoints

    cfg = MergeConfig(method=args.method, models=list(args.models), base=args.base or "", weights=args.weights or [],
                      t=args.t, density=args.density, scale=args.scale, seed=args.seed)
    out = merge_checkpoints(cfg, args.out)
    print(f"merged {len(cfg.models)} checkpoints ({cfg.method}) into {out}")
    return 0


def add_merge_command(sub: Any) -> None:
    """Register ``arborl merge`` on the CLI's subparsers."""
    from arborl.merge.config import METHODS

    p = sub.add_parser("merge", help="merge Hugging Face checkpoints of one architecture (linear, slerp, "
                                     "task_arithmetic, ties, dare)")
    p.add_argument("models", nargs="+", metavar="CKPT", help="checkpoint directories to merge")
    p.add_argument("--method", choices=METHODS, default="linear", help="merge method (default linear)")
    p.add_argument("--out", required=True, help="output checkpoint directory")
    p.add_argument("--weights", type=_floats, help="one weight per checkpoint, comma-separated (default equal)")
    p.add_argument("--base", help="base checkpoint of task_arithmetic, ties and dare")
    p.add_argument("--t", type=float, default=0.5, help="slerp: 0 = first checkpoint, 1 = second (default 0.5)")
    p.add_argument("--density", type=float, default=1.0, help="ties/dare: fraction of task-vector entries kept")
    p.add_argument("--scale", type=float, default=1.0, help="ties: factor of the merged task vector")
    p.add_argument("--seed", type=int, default=0, help="dare: seed of the drop masks")
    p.set_defaults(func=_merge)
