"""Trajectory store benchmark: ingest rate, task-type query and turn slice at scale, each against
a JSONL-dump baseline measured in the same run. Prints one table.

    python bench/store.py                 # 1M stored episodes (8 turns each)
    python bench/store.py --n 100000      # smaller
    python bench/store.py --no-postgres   # skip the PostgreSQL ingest row
    python bench/store.py --ingest-only --no-postgres --ingest-n 5000   # SQLite ingest alone

What is measured:

* ingest: ``put_many`` of real :class:`Episode` objects (8 turns, batches of 500) into an empty
  SQLite file, into the SQLite file holding N episodes, and into PostgreSQL (a throwaway
  server started like the tests do); baseline: appending ``Episode.to_json()`` lines to a file.
  The time includes closing the store: for SQLite that is the final checkpoint, which copies the
  WAL's last pages into the database file, so the rate is not flattered by work left for later.
  Each SQLite row also gives the rate per CPU-second of this process (wall time on a shared
  machine mostly measures the other jobs). ``--ingest-only`` stops after the empty-store rows.
* scale fill (not a put_many measurement): N synthetic episodes are bulk-inserted straight into
  the SQLite layout (index rows, turn rows, unique content hashes) and written as JSONL, so a
  1M-episode store takes minutes, not hours. The time it takes is reported.
* query: ``store.query(task_type=T, limit=100)`` (full episodes, newest first) and
  ``query_index`` (index rows only), p50 over random task types; baseline: one pass over the
  JSONL that parses every line and keeps the newest 100 of type T.
* slice: ``store.slice(id, 3, 6)`` p50 over random ids; baseline: scan the JSONL to the episode,
  parse it, cut its path (median over a few ids).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "store"))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from arborl.store import open_store  # noqa: E402
from arborl.store.codec import prepare  # noqa: E402
from arborl.store.sqlite_turns import INSERT_RECORD, record_rows  # noqa: E402
from arborl.trajectory.schema import Episode, ToolCall, Turn  # noqa: E402

TASK_TYPES = ["search", "code", "frozenlake", "sokoban", "math", "web", "sql", "shell"]
BASE_T = 1_700_000_000.0


def make(i: int, turns: int = 8) -> Episode:
    """A realistic small episode: 8 turns, 48 prompt and 24 output tokens each."""
    ep = Episode(episode_id=hashlib.sha1(str(i).encode()).hexdigest()[:32], task_id=f"task{i % 997}",
                 task_type=TASK_TYPES[i % len(TASK_TYPES)], group_id=f"g{i // 8}", seed=i,
                 rewards={"success": float(i % 3 == 0)}, stop_reason="terminated", policy_version=i // 50_000,
                 iteration=i // 5000, source="rl", created_at=BASE_T + i * 0.5)
    parent = None
    for k in range(turns):
        t = Turn(turn_id=f"t{k}", parent_id=parent, index=k, observation=f"observation {k} of episode {i}",
                 prompt_ids=[(i + k + j) % 32000 for j in range(48)], output_ids=[(i * k + j) % 32000 for j in range(24)],
                 output_logprobs=[0.0 - 0.1 * (j % 7) for j in range(24)], output_mask=[1] * 24,
                 action_text=f"call search(q{k})", action=f"search q{k}", reward=0.1 * (k == turns - 1),
                 tool_call=ToolCall(name="search", arguments={"q": f"q{k}"}), result=f"result {k}",
                 policy_version=i // 50_000)
        ep.add_turn(t)
        parent = t.turn_id
    return ep


def ingest_rate(url: str, n: int, offset: int, cpu: list[float] | None = None) -> float:
    """Episodes per second of put_many (batches of 500) and closing the store, episode construction excluded.

    With ``cpu``, also appends the rate per second of this process's CPU time, which a busy
    machine distorts less than wall time.
    """
    eps = [make(offset + i) for i in range(n)]
    store = open_store(url)
    c, t = time.process_time(), time.perf_counter()
    for lo in range(0, n, 500):
        store.put_many(eps[lo:lo + 500])
    store.close()  # timed too: SQLite's closing checkpoint copies what the WAL still holds into the file
    wall, used = time.perf_counter() - t, time.process_time() - c
    if cpu is not None:
        cpu.append(n / used)
    return n / wall


def jsonl_ingest_rate(path: Path, n: int) -> float:
    eps = [make(i) for i in range(n)]
    t = time.perf_counter()
    with path.open("a") as f:
        for lo in range(0, n, 500):
            f.write("".join(e.to_json() + "\n" for e in eps[lo:lo + 500]))
            f.flush()
    return n / (time.perf_counter() - t)


def bulk_fill(db_path: Path, jsonl_path: Path, n: int) -> float:
    """N synthetic episodes straight into the SQLite layout and a JSONL dump; returns seconds."""
    import sqlite3

    open_store(f"sqlite:///{db_path}").close()  # create the layout
    template = prepare(make(0))
    meta = json.loads(template.meta)
    line_tpl = make(0).to_json()
    t0 = time.perf_counter()
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    for name in ("episodes_type_time", "episodes_time", "episodes_policy_time", "episodes_source_iter"):
        db.execute(f"DROP INDEX {name}")  # rebuilt once after the fill: sorting beats 1M random inserts
    with jsonl_path.open("w") as jf:
        for lo in range(0, n, 50_000):
            ep_rows, turn_rows, lines = [], [], []
            for i in range(lo, min(n, lo + 50_000)):
                eid = hashlib.sha1(str(i).encode()).hexdigest()[:32]
                tt, created = TASK_TYPES[i % len(TASK_TYPES)], BASE_T + i * 0.5
                m = {**meta, "episode_id": eid, "task_type": tt, "created_at": created, "task_id": f"task{i % 997}",
                     "group_id": f"g{i // 8}", "iteration": i // 5000, "policy_version": i // 50_000}
                ep_rows.append((i + 1, eid, hashlib.sha256(str(i).encode()).hexdigest(), f"task{i % 997}", tt,
                                f"g{i // 8}", "rl", i // 5000, i // 50_000, template.row.reward, int(i % 3 == 0),
                                8, 8, "terminated", created, "[]", 1, json.dumps(m)))
                turn_rows += record_rows(i + 1, template.turns)
                lines.append(line_tpl.replace(template.row.episode_id, eid, 1)
                             .replace('"task_type":"search"', f'"task_type":"{tt}"', 1)
                             .replace(f'"created_at":{BASE_T}', f'"created_at":{created}', 1))
            db.execute("BEGIN")
            db.executemany(f"INSERT INTO episodes VALUES ({','.join('?' * 18)})", ep_rows)
            db.executemany(INSERT_RECORD, turn_rows)
            db.execute("COMMIT")
            jf.write("\n".join(lines) + "\n")
    db.close()
    open_store(f"sqlite:///{db_path}").close()  # recreates the dropped indexes
    return time.perf_counter() - t0


def p50_ms(fn, args_list) -> float:
    ts = []
    for a in args_list:
        t = time.perf_counter()
        fn(*a)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000


def jsonl_query(path: Path, task_type: str, limit: int = 100) -> list[Episode]:
    """What a JSONL-dump framework does: parse every line, keep the newest ``limit`` of a type."""
    best: list[tuple[float, str]] = []
    with path.open() as f:
        for line in f:
            d = json.loads(line)
            if d["task_type"] == task_type:
                item = (d["created_at"], line)
                if len(best) < limit:
                    heapq.heappush(best, item)
                else:
                    heapq.heappushpop(best, item)
    return [Episode.from_json(line) for _, line in sorted(best, reverse=True)]


def jsonl_slice(path: Path, episode_id: str, start: int, stop: int) -> list[Turn]:
    needle = f'"episode_id":"{episode_id}"'
    with path.open() as f:
        for line in f:
            if needle in line:
                return Episode.from_json(line).path()[start:stop]
    raise KeyError(episode_id)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="stored episodes for query/slice (default 1M)")
    ap.add_argument("--ingest-n", type=int, default=20_000, help="episodes put_many'd per ingest row")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--ingest-only", action="store_true",
                    help="measure the empty-store ingest rows only (no bulk fill, query or slice)")
    ap.add_argument("--dir", default=None, help="working directory (default: a temp dir)")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="arborl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str, str]] = []
    con = Console()

    con.print(f"ingest: {args.ingest_n} episodes x 8 turns ...")
    cpu: list[float] = []
    sq = ingest_rate(f"sqlite:///{work}/ingest.db", args.ingest_n, 0, cpu)
    jl = jsonl_ingest_rate(work / "ingest.jsonl", args.ingest_n)
    rows.append(("ingest, SQLite (empty)", f"{sq:,.0f} ep/s", f"{jl:,.0f} ep/s", f"{sq / jl:.2f}x"))
    rows.append(("ingest, SQLite (empty), per CPU-s", f"{cpu[0]:,.0f} ep/s", "", ""))
    if not args.no_postgres:
        from store_services import postgres_server

        with postgres_server() as pg:
            pr = ingest_rate(pg, args.ingest_n, 0)
        rows.append(("ingest, PostgreSQL (empty)", f"{pr:,.0f} ep/s", f"{jl:,.0f} ep/s", f"{pr / jl:.2f}x"))
    if args.ingest_only:
        _print_table(con, "arborl trajectory store: ingest", rows)
        return

    con.print(f"bulk fill: {args.n:,} episodes into SQLite and JSONL ...")
    db, dump = work / "big.db", work / "big.jsonl"
    fill_s = bulk_fill(db, dump, args.n)
    rows.append((f"bulk fill {args.n:,} (setup, not put_many)", f"{fill_s:.0f} s", "", ""))

    rng = random.Random(0)
    with open_store(f"sqlite:///{db}") as store:
        types = [(rng.choice(TASK_TYPES),) for _ in range(50)]
        q = p50_ms(lambda t: store.query(task_type=t, limit=100), types)
        qi = p50_ms(lambda t: store.query_index(task_type=t, limit=100), types)
        ids = [(hashlib.sha1(str(rng.randrange(args.n)).encode()).hexdigest()[:32],) for _ in range(200)]
        sl = p50_ms(lambda e: store.slice(e, 3, 6), ids)
        ingest_big = ingest_rate(f"sqlite:///{db}", args.ingest_n, args.n, cpu)
    t = time.perf_counter()
    base_q = jsonl_query(dump, types[0][0])
    jq = (time.perf_counter() - t) * 1000
    assert len(base_q) == 100
    jsl = p50_ms(lambda e: jsonl_slice(dump, e, 3, 6), ids[:3])
    rows += [
        (f"query(task_type, limit=100) p50 @ {args.n:,}", f"{q:.1f} ms", f"{jq:,.0f} ms", f"{jq / q:,.0f}x"),
        (f"query_index(task_type, 100) p50 @ {args.n:,}", f"{qi:.1f} ms", f"{jq:,.0f} ms", f"{jq / qi:,.0f}x"),
        (f"slice(id, 3, 6) p50 @ {args.n:,}", f"{sl:.2f} ms", f"{jsl:,.0f} ms", f"{jsl / sl:,.0f}x"),
        (f"ingest, SQLite (holding {args.n:,})", f"{ingest_big:,.0f} ep/s", f"{jl:,.0f} ep/s", f"{ingest_big / jl:.2f}x"),
        (f"ingest, SQLite (holding {args.n:,}), per CPU-s", f"{cpu[1]:,.0f} ep/s", "", ""),
    ]
    _print_table(con, f"arborl trajectory store (SQLite file {db.stat().st_size / 1e9:.2f} GB, "
                      f"JSONL {dump.stat().st_size / 1e9:.2f} GB)", rows)


def _print_table(con: Console, title: str, rows: list[tuple[str, str, str, str]]) -> None:
    table = Table(title=title)
    for c in ("measure", "store", "JSONL baseline", "store vs baseline"):
        table.add_column(c, justify="left" if c == "measure" else "right")
    for r in rows:
        table.add_row(*r)
    con.print(table)


if __name__ == "__main__":
    main()
