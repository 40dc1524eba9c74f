"""Viewer benchmark: how fast ``arborl view``'s API answers over a big SQLite store. Prints one table.

    python bench/viewer.py              # 1M episodes (8 turns each), the store benchmark's fill
    python bench/viewer.py --n 100000   # smaller

The store is filled as bench/store.py does (:func:`bulk_fill`: synthetic episodes straight into
the SQLite layout). Then the app (:func:`arborl.view.api.create_app`) is served by uvicorn on
127.0.0.1 and each request is timed over real HTTP, end to end (p50 and max of ``--repeat``
requests): the first page of the episode list under several filters and orders (target
<= 200 ms), one 8-turn episode as a tree (with its group), and one group aligned by turn.
A filter the store has no index for (``iteration`` alone: SQLite indexes ``(source, iteration)``)
whose matches are far from the newest rows reads the index by time until it finds them: its row
shows that cost, the row with ``source`` as well shows the indexed case. The fill gives each of
8 consecutive episodes another task type, so its groups hold one episode each.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uvicorn  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from store import bulk_fill  # noqa: E402

from arborl.view.api import create_app  # noqa: E402

LIST_TARGET_MS = 200.0


def serve(url: str) -> tuple[str, uvicorn.Server]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(create_app(url), log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


def timed(base: str, path: str, repeat: int) -> tuple[float, float, int]:
    ts, n = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        with urllib.request.urlopen(base + path, timeout=120) as r:
            body = json.load(r)
        ts.append((time.perf_counter() - t0) * 1000)
        n = len(body.get("episodes", body.get("turns", [])))
    return statistics.median(ts), max(ts), n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="episodes in the store")
    ap.add_argument("--repeat", type=int, default=20, help="requests per row")
    ap.add_argument("--dir", help="keep the store here (default: a temporary directory)")
    args = ap.parse_args(argv)
    d = Path(args.dir or tempfile.mkdtemp(prefix="arborl-bench-viewer-"))
    db = d / "traj.db"
    fill_s = bulk_fill(db, d / "dump.jsonl", args.n) if not db.exists() else 0.0
    (d / "dump.jsonl").unlink(missing_ok=True)
    base, server = serve(f"sqlite:///{db}")
    eid = "b6589fc6ab0dc82cf12099d1c2d40ab9"  # sha1("0")[:32]: episode 0, the oldest
    rows = [
        ("list, first page of 50, no filter", "/api/episodes?limit=50", True),
        ("list, first page of 50, task_type=code", "/api/episodes?limit=50&task_type=code", True),
        ("list, first page of 50, success=false", "/api/episodes?limit=50&success=false", True),
        ("list, first page of 50, iteration=3 (old rows)", "/api/episodes?limit=50&iteration=3", True),
        ("list, first page of 50, source=rl, iteration=3", "/api/episodes?limit=50&source=rl&iteration=3", True),
        ("list, first page of 50, oldest first", "/api/episodes?limit=50&order=oldest", True),
        ("list, first page of 50, stop_reason=terminated", "/api/episodes?limit=50&stop_reason=terminated", True),
        ("list, first page of 500, no filter", "/api/episodes?limit=500", True),
        ("one 8-turn episode as a tree (+ its group)", f"/api/episodes/{eid}", False),
        ("its group aligned by turn", f"/api/episodes/{eid}/group", False),
    ]
    filled = f"fill {fill_s:.0f} s" if fill_s else f"store reused from {d}"
    t = Table(title=f"arborl view API over a {args.n:,}-episode SQLite store ({filled}), {args.repeat} requests each")
    for c in ("request", "items", "p50 ms", "max ms", f"list target <= {LIST_TARGET_MS:.0f} ms"):
        t.add_column(c, justify="left" if c == "request" else "right")
    for name, path, is_list in rows:
        p50, mx, n = timed(base, path, args.repeat)
        t.add_row(name, str(n), f"{p50:.1f}", f"{mx:.1f}", ("yes" if p50 <= LIST_TARGET_MS else "NO") if is_list else "")
    server.should_exit = True
    Console().print(t)


if __name__ == "__main__":
    main()
