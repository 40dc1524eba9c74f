"""A read command never creates or alters anything, and a target that is not an arborl store is
refused naming it, before anything is written (issue 9, items 2 and 3): through the real
`arborl store` CLI (exit 2, one line, no traceback; file bytes unchanged, no blobs folder), and on
every backend through open_store."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from storekit import make_episode

from arborl.store import StoreError, open_store
from arborl.store.cli import main as store_main


def _arborl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed entry point's code path: ``python -m arborl.cli store ...``."""
    return subprocess.run([sys.executable, "-m", "arborl.cli", "store", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _foreign_db(path: Path, wal: bool = False) -> None:
    db = sqlite3.connect(path)
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users VALUES (1, 'ada')")
    db.commit()
    db.close()


def _assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_cli_query_of_a_foreign_sqlite_database_is_refused_and_changes_nothing(tmp_path):
    other = tmp_path / "other.db"
    _foreign_db(other)
    before = _snapshot(tmp_path)
    r = _arborl("query", f"sqlite:///{other}")
    _assert_one_line_error(r, str(other), "not an arborl store", "users")
    assert _snapshot(tmp_path) == before  # same bytes, no other.db.blobs/, no -wal/-shm


def test_cli_query_of_a_text_file_is_refused_without_a_traceback(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    before = _snapshot(tmp_path)
    _assert_one_line_error(_arborl("query", f"sqlite:///{text}"), str(text), "is not an SQLite database")
    assert _snapshot(tmp_path) == before


def test_cli_relative_sqlite_url_gets_the_four_slash_hint(tmp_path):
    # run where there is no ./tmp, while /tmp exists: sqlite:///tmp/x.db means ./tmp/x.db
    r = _arborl("query", "sqlite:///tmp/x.db", cwd=tmp_path)
    _assert_one_line_error(r, "relative path tmp/x.db", "sqlite:////tmp/x.db")
    assert list(tmp_path.iterdir()) == []


def test_cli_unknown_scheme_and_password_are_one_redacted_line(tmp_path):
    r = _arborl("query", "mongodb://user:hunter2@host/db")
    _assert_one_line_error(r, "unsupported store URL", "mongodb://user:***@host/db")
    assert "hunter2" not in r.stderr


@pytest.mark.parametrize("wal", [False, True], ids=["rollback-journal", "wal"])
@pytest.mark.parametrize("command", [["query"], ["profile"], ["slice", "{url}", "ep1"], ["export", "{url}", "{out}"],
                                     ["expire", "{url}", "--older-than", "1d"]])
def test_every_store_command_refuses_a_foreign_database(tmp_path, capsys, command, wal):
    other = tmp_path / "other.db"
    _foreign_db(other, wal=wal)
    before = _snapshot(tmp_path)
    url, out = f"sqlite:///{other}", str(tmp_path / "out.parquet")
    argv = [command[0], url] if len(command) == 1 else [a.format(url=url, out=out) for a in command]
    assert store_main(argv) == 2
    err = capsys.readouterr().err
    assert "not an arborl store" in err and str(other) in err
    assert _snapshot(tmp_path) == before


def test_writing_into_a_foreign_or_broken_file_is_refused_before_any_write(tmp_path):
    other, text, empty_db = tmp_path / "other.db", tmp_path / "t.txt", tmp_path / "empty.db"
    _foreign_db(other)
    text.write_bytes(b"SQLite format 2\x00 but not really")
    sqlite3.connect(empty_db).execute("VACUUM")  # a real SQLite file with no tables
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError, match="not an arborl store"):
        open_store(f"sqlite:///{other}")
    with pytest.raises(StoreError, match="is not an SQLite database"):
        open_store(f"sqlite:///{text}")
    assert _snapshot(tmp_path) == before
    with pytest.raises(StoreError, match=r"empty.db is an SQLite database but not an arborl store \(its tables: none\)"):
        open_store(f"sqlite:///{empty_db}", read_only=True)
    with open_store(f"sqlite:///{empty_db}") as store:  # an empty database may become a store
        store.put_many([make_episode(1)])


def test_read_only_store_reads_and_refuses_writes(tmp_path):
    url = f"sqlite:///{tmp_path}/traj.db"
    with open_store(url) as store:
        store.put_many([make_episode(1)])
    before = (tmp_path / "traj.db").read_bytes()
    with open_store(url, read_only=True) as store:
        assert store.get("ep000001") == make_episode(1) and store.count() == 1
        with pytest.raises(StoreError, match="read-only"):
            store.put_many([make_episode(2)])
        with pytest.raises(StoreError, match="read-only"):
            store.expire(older_than=None)
    assert (tmp_path / "traj.db").read_bytes() == before
    assert not (tmp_path / "traj.db.blobs").exists()  # the blob folder is made by the first media put


def test_a_new_store_still_in_its_wal_opens_read_only(tmp_path):
    # a writer that has not checkpointed yet holds the tables in traj.db-wal only
    writer = open_store(f"sqlite:///{tmp_path}/traj.db")
    try:
        writer.put_many([make_episode(1)])
        assert (tmp_path / "traj.db-wal").exists()
        with open_store(f"sqlite:///{tmp_path}/traj.db", read_only=True) as reader:
            assert reader.count() == 1
    finally:
        writer.close()


def test_open_store_in_train_refuses_an_unknown_scheme_with_a_store_error():
    with pytest.raises(StoreError, match="unsupported store URL 'mysql://") as e:
        open_store("mysql://u@h/db")
    assert "\n" not in str(e.value)


def test_relative_sqlite_url_with_a_missing_directory_is_refused_when_creating(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"sqlite:////tmp/x\.db \(four slashes\)"):
        open_store("sqlite:///tmp/x.db")
    assert list(tmp_path.iterdir()) == []
    with open_store("sqlite:///runs/x.db") as s:  # no /runs either: a plain relative path, created
        s.put_many([make_episode(1)])
    assert (tmp_path / "runs" / "x.db").exists()


def test_export_without_pyarrow_names_the_extra(tmp_path):
    url = f"sqlite:///{tmp_path}/traj.db"
    with open_store(url) as store:
        store.put_many([make_episode(1)])
    code = ("import sys; sys.modules['pyarrow'] = None  # as if not installed\n"
            "from arborl.store.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "export", url, str(tmp_path / "x.parquet")], capture_output=True,
                       text=True, timeout=120)
    _assert_one_line_error(r, "pip install 'arborl[export]'")


# --- PostgreSQL and Redis -------------------------------------------------------------------------
@pytest.mark.services
def test_postgres_foreign_tables_and_missing_store_are_refused_and_untouched(pg_server):
    import psycopg

    name = "f" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    url = f"{pg_server.rsplit('/', 1)[0]}/{name}"
    try:
        with pytest.raises(StoreError, match="no arborl store in this database"):
            open_store(url, read_only=True)
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
            c.execute("CREATE TABLE arborl_episodes(x int)")  # someone else's table under our name
        with pytest.raises(StoreError, match=r"holds the tables \['arborl_episodes'\] but no arborl store"):
            open_store(url)
        with psycopg.connect(url, autocommit=True) as c:
            tables = [r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        assert tables == ["arborl_episodes"]
    finally:
        with psycopg.connect(pg_server, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.services
def test_postgres_read_only_store_refuses_writes(store_url):
    if not store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    with open_store(store_url) as store:
        store.put_many([make_episode(1)])
    with open_store(store_url, read_only=True) as store:
        assert store.count() == 1
        with pytest.raises(StoreError, match="read-only"):
            store.put_many([make_episode(2)])


@pytest.mark.services
def test_redis_foreign_keyspace_and_missing_store_are_refused_and_untouched(redis_url_server, tmp_path):
    import redis

    prefix = "f" + uuid.uuid4().hex[:12]
    r = redis.Redis.from_url(redis_url_server, decode_responses=True)
    url = f"{redis_url_server}?prefix={prefix}&blob=file://{tmp_path}/blobs"
    with pytest.raises(StoreError, match=f"no arborl store with prefix '{prefix}'"):
        open_store(url, read_only=True)
    assert r.keys(f"{prefix}:*") == []
    r.set(f"{prefix}:session", "someone else's")
    with pytest.raises(StoreError, match=f"keys under prefix '{prefix}' are not an arborl store"):
        open_store(url)
    r.delete(f"{prefix}:session")
    r.set(f"{prefix}:meta", "a string")
    with pytest.raises(StoreError, match="is a string without a layout_version"):
        open_store(url)
    assert r.keys(f"{prefix}:*") == [f"{prefix}:meta"] and r.get(f"{prefix}:meta") == "a string"
    assert not (tmp_path / "blobs").exists()


@pytest.mark.services
def test_read_only_redis_with_s3_creates_no_bucket(redis_url_server, s3_endpoint, aws_env):
    import boto3

    bucket = "b" + uuid.uuid4().hex[:12]
    url = f"{redis_url_server}?prefix={bucket}&blob=s3://{bucket}/bodies&s3_endpoint={s3_endpoint}"
    with pytest.raises(StoreError, match=f"no bucket s3://{bucket}"):
        open_store(url, read_only=True)
    names = [b["Name"] for b in boto3.client("s3", endpoint_url=s3_endpoint).list_buckets()["Buckets"]]
    assert bucket not in names
