"""SQLite-only behaviour: URL forms, what expiry removes, query plans use the indexes, and stores of
the previous table layout (1) read and extended by this one (2)."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta

from storekit import make_episode

from arborl.store import open_store
from arborl.store.codec import prepare
from arborl.trajectory.schema import Episode


def test_relative_and_absolute_sqlite_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///runs/traj.db") as s:
        s.put_many([make_episode(1)])
    assert (tmp_path / "runs" / "traj.db").exists()
    with open_store(f"sqlite:///{tmp_path}/abs.db") as s:  # "sqlite:///" + "/abs/path" = four slashes
        s.put_many([make_episode(1)])
    assert (tmp_path / "abs.db").exists()


def test_expire_removes_turns_and_tags_too(sqlite_url):
    with open_store(sqlite_url) as store:
        store.put_many([make_episode(0, created_at=100.0, tags=["x", "y"]), make_episode(1, created_at=10_000.0)])
        assert store.expire(older_than=timedelta(seconds=1000), now=5000.0) == 1
        assert store._db.execute("SELECT COUNT(*) FROM turn_records").fetchone()[0] == 4
        assert store._db.execute("SELECT COUNT(*) FROM tags").fetchone()[0] == 0


def test_queries_use_indexes(sqlite_url):
    with open_store(sqlite_url) as store:
        store.put_many([make_episode(i) for i in range(10)])
        db = store._db

        def plan(sql: str, args: tuple) -> str:
            return " | ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, args))

        p = plan("SELECT seq FROM episodes WHERE task_type = ? AND (created_at < ? OR (created_at = ? AND seq < ?)) "
                 "ORDER BY created_at DESC, seq DESC LIMIT 100", ("search", 1.0, 1.0, 5))
        assert "episodes_type_time" in p and "TEMP B-TREE" not in p
        p = plan("SELECT record FROM turn_records WHERE id >= ? AND id < ? AND path_index >= ? AND path_index < ?",
                 (1 << 20, 2 << 20, 3, 6))
        assert "INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in p and "SCAN" not in p
        p = plan("SELECT seq FROM episodes WHERE content_hash IN (?)", ("x",))
        assert "sqlite_autoindex_episodes_2" in p or "content_hash" in p


# --- layout 1 (turns table with one column per packed array), as arborl wrote it before layout 2 ---
_LAYOUT_1 = """
CREATE TABLE store_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE episodes(
  seq INTEGER PRIMARY KEY, episode_id TEXT NOT NULL UNIQUE, content_hash TEXT NOT NULL UNIQUE,
  task_id TEXT NOT NULL, task_type TEXT NOT NULL, group_id TEXT NOT NULL, source TEXT NOT NULL,
  iteration INTEGER NOT NULL, policy_version INTEGER NOT NULL,
  reward REAL NOT NULL, success INTEGER, n_turns INTEGER NOT NULL, n_nodes INTEGER NOT NULL,
  stop_reason TEXT NOT NULL, created_at REAL NOT NULL, tags TEXT NOT NULL,
  schema_version INTEGER NOT NULL, meta TEXT NOT NULL);
CREATE INDEX episodes_type_time ON episodes(task_type, created_at);
CREATE INDEX episodes_time ON episodes(created_at);
CREATE INDEX episodes_policy_time ON episodes(policy_version, created_at);
CREATE INDEX episodes_source_iter ON episodes(source, iteration);
CREATE TABLE turns(
  id INTEGER PRIMARY KEY, path_index INTEGER, turn_id TEXT NOT NULL, parent_id TEXT,
  reward REAL NOT NULL, timings TEXT NOT NULL, body TEXT NOT NULL,
  prompt_ids BLOB, output_ids BLOB, output_logprobs BLOB, output_mask BLOB);
CREATE TABLE tags(tag TEXT NOT NULL, ep INTEGER NOT NULL, PRIMARY KEY(tag, ep)) WITHOUT ROWID;
INSERT INTO store_meta VALUES('layout_version', '1');
"""


def _append_layout_1(db: sqlite3.Connection, episodes: list[Episode]) -> None:
    """Episode and turn rows as the layout-1 writer made them: the turn's canonical JSON without the
    arrays that pack, and the packed arrays (prompt_ids first) in their own columns, NULL if in the JSON."""
    base = db.execute("SELECT COALESCE(MAX(seq), 0) FROM episodes").fetchone()[0]
    for k, ep in enumerate(episodes, start=base + 1):
        p = prepare(ep)
        r = p.row
        db.execute(f"INSERT INTO episodes VALUES ({','.join('?' * 18)})",
                   (k, r.episode_id, r.content_hash, r.task_id, r.task_type, r.group_id, r.source, r.iteration,
                    r.policy_version, r.reward, r.success, r.n_turns, r.n_nodes, r.stop_reason, r.created_at,
                    json.dumps(r.tags), r.schema_version, p.meta))
        for i, ((pi, tid, pid, reward, timings, _), c) in enumerate(zip(p.turns, p.canon, strict=True)):
            oi, ol, om, prompt = (a if isinstance(a, bytes) else None for a in c.arrays)
            db.execute("INSERT INTO turns VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       ((k << 20) | i, pi, tid, pid, reward, timings, c.text(packed=True), prompt, oi, ol, om))
        db.executemany("INSERT INTO tags VALUES (?,?)", [(tag, k) for tag in set(r.tags)])


def test_layout_1_store_is_read_and_extended_in_layout_2(tmp_path):
    path = tmp_path / "old.db"
    old = [make_episode(i, n_turns=3, branch=(i == 1), tags=["x"] if i == 2 else None) for i in range(3)]
    old[2].turns[0].output_logprobs = [0, -0.25]  # an int among the log-probs: kept in the body as JSON
    db = sqlite3.connect(path)
    db.executescript(_LAYOUT_1)
    _append_layout_1(db, old)
    db.commit()
    db.close()
    twin = Episode.from_dict({**old[0].to_dict(), "episode_id": "twin"})  # old content under a new id
    new = [make_episode(i, n_turns=3) for i in range(3, 5)]
    with open_store(f"sqlite:///{path}") as store:
        assert store.get_many([e.episode_id for e in old]) == old
        assert store.slice("ep000001", 1, 3) == old[1].path()[1:3]
        assert [r.episode_id for r in store.query_index(tags=["x"])[0]] == ["ep000002"]
        assert store.put_many([twin, *new]) == ["ep000000", "ep000003", "ep000004"]  # dedup against layout 1
        assert store.get_many(["ep000002", "ep000003"]) == [old[2], new[0]]
        assert store.slice("ep000004", 2) == new[1].turns[2:]
        db = store._db
        assert db.execute("SELECT value FROM store_meta WHERE key='layout_version'").fetchone() == ("2",)
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone() == (3 + 4 + 3,)
        assert db.execute("SELECT COUNT(*) FROM turn_records").fetchone() == (6,)
        # a writer of the old layout that opened the store before the upgrade may still append there
        late = make_episode(9, n_turns=2)
        _append_layout_1(db, [late])
        assert store.get("ep000009") == late and store.slice("ep000009", 1) == late.turns[1:]
        assert store.expire(older_than=timedelta(seconds=1), now=2_000_000_000.0) == 6
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM turn_records").fetchone() == (0,)


def test_new_store_has_no_layout_1_table(sqlite_url):
    with open_store(sqlite_url) as store:
        store.put_many([make_episode(1)])
        names = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "turns" not in names and "turn_records" in names
