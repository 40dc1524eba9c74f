"""SQLite-only behaviour: URL forms, what expiry removes, query plans use the indexes."""

from __future__ import annotations

from datetime import timedelta

from storekit import make_episode

from arborl.store import open_store


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
