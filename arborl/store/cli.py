"""``arborl store query|slice|show|profile|export|expire STORE_URL [filters]``: inspect a store.

``query``, ``slice``, ``show``, ``profile`` and ``export`` open the store read-only: they never create or
change anything, and a target that is not an arborl store is refused. Errors are one line on
stderr with exit status 2, passwords in URLs shown as ``***``.

Hooked into the main CLI with :func:`add_store_commands`; also runnable on its own as
``python -m arborl.store.cli query sqlite:///runs/traj.db --task-type search``. Output is a
table (rich) in the terminal, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from arborl.store.base import GROUP_BY_COLUMNS, EpisodeNotFound, StoreError
from arborl.store.url import open_store, parse_duration, redact
from arborl.trajectory.schema import SchemaError


def _add_filters(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("filters")
    g.add_argument("--task-type", help="exact task type")
    g.add_argument("--min-reward", type=float, help="episode reward >= this (sum of step rewards on the main path)")
    g.add_argument("--max-reward", type=float, help="episode reward <= this")
    g.add_argument("--since", type=float, help="created_at >= this unix time")
    g.add_argument("--until", type=float, help="created_at < this unix time")
    g.add_argument("--policy-version", type=int, help="exact policy version")
    g.add_argument("--tag", action="append", dest="tags", help="required tag (repeatable: all must match)")
    g.add_argument("--source", help="synth, rl, eval, ...")
    g.add_argument("--iteration", type=int, help="exact training iteration")
    g.add_argument("--min-iteration", type=int)
    g.add_argument("--max-iteration", type=int)
    g.add_argument("--success", choices=("true", "false"), help="scored episodes that succeeded / failed")
    g.add_argument("--stop-reason", help="exact stop reason: terminated, truncated, env_error, max_context, ...")


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("task_type", "min_reward", "max_reward", "since", "until", "policy_version", "tags", "source",
            "iteration", "min_iteration", "max_iteration", "stop_reason")
    f = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "success", None) is not None:
        f["success"] = args.success == "true"
    return f


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", metavar="STORE_URL", help="e.g. sqlite:///runs/traj.db")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _add_subcommands(sub: Any) -> None:
    p = sub.add_parser("query", help="list matching episodes, newest first")
    _common(p)
    _add_filters(p)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--cursor", help="next_cursor printed by the previous page")
    p.set_defaults(func=_guarded(cmd_query))

    p = sub.add_parser("slice", help="print turns START..STOP-1 along an episode's main path")
    _common(p)
    p.add_argument("episode_id")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int)
    p.set_defaults(func=_guarded(cmd_slice))

    p = sub.add_parser("show", help="print one episode as readable text: its facts and tree of turns")
    p.add_argument("url", metavar="STORE_URL", help="e.g. sqlite:///runs/traj.db")
    p.add_argument("episode_id")
    p.set_defaults(func=_guarded(cmd_show))

    p = sub.add_parser("profile", help="capability profile: count, success rate, mean reward and turns per group")
    _common(p)
    _add_filters(p)
    p.add_argument("--group-by", default="task_type,policy_version",
                   help=f"comma-separated columns among {', '.join(GROUP_BY_COLUMNS)}")
    p.set_defaults(func=_guarded(cmd_profile))

    p = sub.add_parser("export", help="write matching episodes to Parquet, one row per turn")
    _common(p)
    _add_filters(p)
    p.add_argument("out", help="output .parquet file")
    p.set_defaults(func=_guarded(cmd_export))

    p = sub.add_parser("expire", help="delete old episodes (--older-than, else the URL's ttl= settings)")
    _common(p)
    p.add_argument("--older-than", type=parse_duration, help="e.g. 7d, 12h")
    p.add_argument("--task-type")
    p.set_defaults(func=_guarded(cmd_expire))


def add_store_commands(subparsers: Any) -> None:
    """Add ``store query|slice|profile|export|expire`` to a CLI's subparsers."""
    p = subparsers.add_parser("store", help="inspect a trajectory store (query, slice, show, profile, export, expire)")
    _add_subcommands(p.add_subparsers(dest="store_command", required=True))


def _emit(args: argparse.Namespace, data: Any, table: Table | None) -> None:
    if args.json or table is None:
        print(json.dumps(data, indent=2, default=str))
    else:
        Console().print(table)


def cmd_query(args: argparse.Namespace) -> int:
    """Handler of ``store query``."""
    with open_store(args.url, read_only=True) as store:
        rows, nxt = store.query_index(limit=args.limit, cursor=args.cursor, **_filters(args))
    data = {"episodes": [r.to_dict() for r in rows], "next_cursor": nxt}
    t = Table(title=f"{len(rows)} episode(s) in {redact(args.url)}", caption=f"next cursor: {nxt}" if nxt else None)
    t.add_column("episode_id", overflow="fold", min_width=12)
    for c in ("task_type", "source", "iter", "policy", "reward", "success", "turns", "stop", "tags"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(r.episode_id, r.task_type, r.source, str(r.iteration), str(r.policy_version), f"{r.reward:.3g}",
                  "-" if r.success is None else str(r.success), str(r.n_turns), r.stop_reason, ",".join(r.tags))
    _emit(args, data, t)
    return 0


def cmd_slice(args: argparse.Namespace) -> int:
    """Handler of ``store slice``."""
    with open_store(args.url, read_only=True) as store:
        turns = store.slice(args.episode_id, args.start, args.stop)
    start = args.start
    data = [{"path_index": start + k, **{f: getattr(tu, f) for f in (
        "turn_id", "observation", "action_text", "result", "reward", "valid", "terminated", "truncated", "error")}}
        for k, tu in enumerate(turns)]
    t = Table(title=f"{args.episode_id} turns {start}..{start + len(turns) - 1}")
    for c in ("#", "turn", "observation", "action", "result", "reward"):
        t.add_column(c, overflow="fold")
    for d in data:
        t.add_row(str(d["path_index"]), d["turn_id"], d["observation"][:200], d["action_text"][:200],
                  (d["result"] or "")[:200], f"{d['reward']:.3g}")
    _emit(args, data, t)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Handler of ``store show``: the episode's facts and tree of turns (arborl.view.text)."""
    from arborl.view.text import render_episode

    with open_store(args.url, read_only=True) as store:
        render_episode(store.get(args.episode_id))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Handler of ``store profile``."""
    cols = tuple(c for c in args.group_by.split(",") if c)
    with open_store(args.url, read_only=True) as store:
        prof = store.profile(group_by=cols, **_filters(args))
    data = [p.to_dict() for p in prof]
    t = Table(title=f"capability profile of {redact(args.url)}",
              caption="success = success rate among scored episodes; reward and turns are means")
    for c in cols:
        t.add_column(c, min_width=len(c), overflow="fold")
    for c in ("count", "scored", "success", "reward", "turns"):
        t.add_column(c, justify="right")
    for p in prof:
        sr = "-" if p.success_rate is None else f"{p.success_rate:.1%}"
        t.add_row(*(str(p.group[c]) for c in cols), str(p.count), str(p.n_scored), sr,
                  f"{p.mean_reward:.3f}", f"{p.mean_turns:.2f}")
    _emit(args, data, t)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Handler of ``store export``."""
    with open_store(args.url, read_only=True) as store:
        n = store.export_parquet(args.out, **_filters(args))
    _emit(args, {"path": args.out, "rows": n}, None if args.json else _kv("export", {"path": args.out, "rows": n}))
    return 0


def cmd_expire(args: argparse.Namespace) -> int:
    """Handler of ``store expire``."""
    older: timedelta | None = args.older_than
    with open_store(args.url, create=False) as store:
        if older is None and not store.config.ttl_by_task_type and store.config.default_ttl is None:
            raise StoreError("nothing to expire by: pass --older-than 7d or put ttl=task:7d,*:30d in the store URL")
        n = store.expire(older_than=older, task_type=args.task_type)
    _emit(args, {"deleted": n}, None if args.json else _kv("expire", {"deleted": n}))
    return 0


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report store errors as one line and exit status 2 (also when run from the main CLI)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except EpisodeNotFound as e:
            print(f"arborl store: error: no episode {e.args[0]!r} in {redact(args.url)}", file=sys.stderr)
        except (StoreError, SchemaError, ValueError, ImportError) as e:
            print(f"arborl store: error: {redact(str(e))}", file=sys.stderr)
        return 2

    return run


def _kv(title: str, d: dict[str, Any]) -> Table:
    t = Table(title=title, show_header=False)
    for k, v in d.items():
        t.add_row(k, str(v))
    return t


def main(argv: Sequence[str] | None = None) -> int:
    """Run one store command, e.g. ``main(["profile", "sqlite:///runs/traj.db", "--json"])``."""
    parser = argparse.ArgumentParser(prog="arborl store", description="Inspect an arborl trajectory store.")
    _add_subcommands(parser.add_subparsers(dest="store_command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
