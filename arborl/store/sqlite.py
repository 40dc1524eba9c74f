"""SQLite trajectory store: the embedded default (no service to run).

Layout (``LAYOUT_VERSION`` in table ``store_meta``; a newer layout is refused on open):

* ``episodes``: one index row per episode (typed columns) plus ``meta``, the episode's JSON
  without its turns. ``seq`` (integer primary key) is the insertion order and keyset tiebreak.
  Indexes: ``episode_id`` and ``content_hash`` unique; (task_type, created_at);
  (created_at); (policy_version, created_at); (source, iteration).
* ``turn_records``: one row per turn with the turn's position on the main path, its ids, step
  reward and timings, and its frames of the canonical form (token arrays packed; see
  :mod:`arborl.store.sqlite_turns`). Its integer primary key is ``(episode seq << 20) | creation
  order``, so the turns of an episode are adjacent in the table b-tree (no second index, and rows
  up to ~4 KB stay on their page). ``slice`` reads only the rows it returns; no other turn is
  decoded. Stores written with layout 1 keep their turns in table ``turns`` and are read as well
  (opening one adds ``turn_records`` and marks it layout 2).
* ``tags``: (tag, episode seq) for tag filters.

Writes run in ``BEGIN IMMEDIATE`` transactions in WAL mode: one ``put_many`` is atomic, several
processes can write at once (they take turns on the write lock; ``busy_timeout`` waits), and a
writer killed with ``kill -9`` leaves the last committed state. With the default
``synchronous=NORMAL`` a *power loss* may drop the last transactions (never corrupt the file);
pass ``?synchronous=full`` in the URL to make each returned ``put_many`` survive power loss too.
The WAL is checkpointed into the database every 32 MiB (SQLite's default is 4 MiB, about one
500-episode batch), which halves write time and does not change what a commit guarantees.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from arborl.store.base import (
    EpisodeNotFound,
    Filters,
    IndexRow,
    ProfileRow,
    StoreConfig,
    StoreError,
    check_group_by,
    check_schema_version,
)
from arborl.store.blob import BlobStore, FileBlobStore
from arborl.store.codec import Prepared, dedup_batch, episode_from, gc_paused, prepare_many, turns_from
from arborl.store.common import BaseStore, expiry_rules, keyset_condition, sql_where
from arborl.store.sqlite_turns import (
    INSERT_RECORD,
    RECORDS_TABLE,
    delete_turns,
    read_path,
    read_turns,
    record_rows,
)
from arborl.trajectory.schema import Episode, SchemaError, Turn

LAYOUT_VERSION = 2
"""Version of the table layout below; bump on incompatible changes. 2: turns in ``turn_records``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS store_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes(
  seq INTEGER PRIMARY KEY,
  episode_id TEXT NOT NULL UNIQUE,
  content_hash TEXT NOT NULL UNIQUE,
  task_id TEXT NOT NULL, task_type TEXT NOT NULL, group_id TEXT NOT NULL, source TEXT NOT NULL,
  iteration INTEGER NOT NULL, policy_version INTEGER NOT NULL,
  reward REAL NOT NULL, success INTEGER, n_turns INTEGER NOT NULL, n_nodes INTEGER NOT NULL,
  stop_reason TEXT NOT NULL, created_at REAL NOT NULL, tags TEXT NOT NULL,
  schema_version INTEGER NOT NULL, meta TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS episodes_type_time ON episodes(task_type, created_at);
CREATE INDEX IF NOT EXISTS episodes_time ON episodes(created_at);
CREATE INDEX IF NOT EXISTS episodes_policy_time ON episodes(policy_version, created_at);
CREATE INDEX IF NOT EXISTS episodes_source_iter ON episodes(source, iteration);
CREATE INDEX IF NOT EXISTS episodes_iter_time ON episodes(iteration, created_at);
CREATE TABLE IF NOT EXISTS tags(tag TEXT NOT NULL, ep INTEGER NOT NULL, PRIMARY KEY(tag, ep)) WITHOUT ROWID;
""" + RECORDS_TABLE

ROW_COLUMNS = ("episode_id", "task_id", "task_type", "group_id", "source", "iteration", "policy_version",
               "reward", "success", "n_turns", "n_nodes", "stop_reason", "content_hash", "created_at",
               "tags", "schema_version")
_SELECT_ROW = "SELECT seq, " + ", ".join(ROW_COLUMNS) + " FROM episodes"
_CHUNK = 500  # stay well under SQLite's bound-parameter limit


def _row(r: Sequence[Any]) -> IndexRow:
    (eid, task_id, task_type, group_id, source, it, pv, reward, success, n_turns, n_nodes, stop, h,
     created, tags, sv) = r
    return IndexRow(eid, task_id, task_type, group_id, source, it, pv, reward,
                    None if success is None else bool(success), n_turns, n_nodes, stop, h, created,
                    json.loads(tags), sv)


class SQLiteStore(BaseStore):
    """Trajectory store in one SQLite file.

    Args:
        path: Database file (created with its parent directory if missing and ``create``).
        blobs: Blob store for media (default: files in ``<path>.blobs/``, made by the first media put).
        config: TTLs and other shared settings.
        synchronous: SQLite ``synchronous`` pragma: "normal" (default) or "full".
        busy_timeout_s: How long a writer waits for another process's write lock.
        create: Create a missing (or empty) file as a new store.
        read_only: Open for reading only: nothing is created or changed (SQLite may add the store's
            own ``-wal``/``-shm`` files, as any reader of a WAL database does); writes raise.

    Raises:
        StoreError: the file is missing (and not ``create``), is not an SQLite database, or is a
            database that is not an arborl store; it is then left exactly as it was.
    """

    def __init__(self, path: str | Path, blobs: BlobStore | None = None, config: StoreConfig | None = None,
                 synchronous: str = "normal", busy_timeout_s: float = 60.0, create: bool = True,
                 read_only: bool = False) -> None:
        if synchronous.lower() not in ("normal", "full"):
            raise StoreError(f"synchronous must be 'normal' or 'full', got {synchronous!r}")
        self.path = Path(path)
        self.read_only = read_only
        is_store = _inspect(self.path, create and not read_only)
        self.blobs = blobs or FileBlobStore(str(self.path) + ".blobs")
        self.config = config or StoreConfig()
        self._lock = threading.RLock()
        if not is_store:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        target = f"file:{quote(str(self.path.resolve()))}?mode=ro" if read_only else str(self.path)
        # Autocommit mode: transactions are explicit BEGIN IMMEDIATE ... COMMIT below.
        self._db = sqlite3.connect(target, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False,
                                   uri=read_only)
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        self._db.execute("PRAGMA cache_size=-65536")  # 64 MiB page cache
        if read_only:
            self._legacy = self._check_layout()
            return
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        # Checkpoint the WAL every 32 MiB, not every 4 MiB (the default): a 500-episode put_many
        # writes ~4 MiB, so the default copied and fsynced the database after nearly every commit
        # (half the write time). Durability is unchanged: a commit is durable once in the WAL.
        self._db.execute("PRAGMA wal_autocheckpoint=8192")
        self._db.execute(f"PRAGMA journal_size_limit={64 << 20}")  # truncate the WAL back after a checkpoint
        self._init_layout()

    def _check_layout(self) -> bool:
        """Refuse a layout newer than this arborl reads; return whether the layout-1 turns table exists."""
        row = self._db.execute("SELECT value FROM store_meta WHERE key='layout_version'").fetchone()
        if row is not None and int(row[0]) > LAYOUT_VERSION:
            raise StoreError(
                f"{self.path} has store layout version {row[0]}, written by a newer arborl; this arborl "
                f"reads layout <= {LAYOUT_VERSION}. Upgrade arborl to open it."
            )
        return self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turns'").fetchone() is not None

    def _init_layout(self) -> None:
        with self._write():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
            self._legacy = self._check_layout()
            # Layout 1 -> 2 adds turn_records (above) for new episodes and keeps the old turns table
            # for reading; the new version number keeps older arborl, which would miss those
            # turns, from opening the store.
            self._db.execute("INSERT OR REPLACE INTO store_meta VALUES('layout_version', ?)", (str(LAYOUT_VERSION),))

    def _write(self) -> _Tx:
        if self.read_only:
            raise StoreError(f"{self.path} was opened read-only; open it without read_only to write")
        return _Tx(self._db, self._lock)

    # --- write ---------------------------------------------------------------------------------
    def put_many(self, episodes: Iterable[Episode | dict[str, Any]]) -> list[str]:
        """Store episodes in one transaction; duplicates (same content hash) are not stored twice.

        Returns:
            One id per input episode: its own id, or the id already stored for the same content.

        Raises:
            SchemaError: an episode is malformed, or reuses a stored episode_id for other content.
                Nothing from the call is stored.
        """
        with gc_paused():
            prepared = prepare_many(episodes)
            unique, alias = dedup_batch(prepared)
            with self._write():
                existing = self._existing(unique)
                new = [p for p in unique if p.row.content_hash not in existing]
                self._insert(new)
            out = [existing.get(p.row.content_hash, alias.get(p.row.episode_id, p.row.episode_id)) for p in prepared]
            del prepared, unique, new  # freed now, so the resuming collector has nothing young to walk
        return out

    def _existing(self, unique: list[Prepared]) -> dict[str, str]:
        """content_hash -> stored id for the batch; reject an id reused for different content."""
        found: dict[str, str] = {}
        for i in range(0, len(unique), _CHUNK):
            part = unique[i:i + _CHUNK]
            marks = ",".join("?" * len(part))
            hashes = [p.row.content_hash for p in part]
            found.update(self._db.execute(
                f"SELECT content_hash, episode_id FROM episodes WHERE content_hash IN ({marks})", hashes))
            ids = [p.row.episode_id for p in part]
            mine = {p.row.episode_id: p.row.content_hash for p in part}
            for eid, h in self._db.execute(
                    f"SELECT episode_id, content_hash FROM episodes WHERE episode_id IN ({marks})", ids):
                if h != mine[eid]:
                    raise SchemaError(
                        f"episode_id {eid} is already stored with different content; episodes are "
                        "immutable, so store the new version under a new episode_id")
        return found

    def _insert(self, new: list[Prepared]) -> None:
        if not new:
            return
        base = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM episodes").fetchone()[0]
        ep_rows, turn_rows, tag_rows = [], [], []
        for k, p in enumerate(new, start=base + 1):
            r = p.row
            ep_rows.append((k, r.episode_id, r.content_hash, r.task_id, r.task_type, r.group_id, r.source,
                            r.iteration, r.policy_version, r.reward, r.success, r.n_turns, r.n_nodes,
                            r.stop_reason, r.created_at, json.dumps(r.tags) if r.tags else "[]", r.schema_version,
                            p.meta))
            turn_rows += record_rows(k, p.turns, r.episode_id)
            tag_rows += [(tag, k) for tag in set(r.tags)]
        self._db.executemany(f"INSERT INTO episodes VALUES ({','.join('?' * 18)})", ep_rows)
        self._db.executemany(INSERT_RECORD, turn_rows)
        self._db.executemany("INSERT INTO tags VALUES (?,?)", tag_rows)

    # --- read ----------------------------------------------------------------------------------
    def _where(self, f: Filters) -> tuple[list[str], list[Any]]:
        conds, args = sql_where(f, "?")
        for tag in f.tags or ():
            conds.append("seq IN (SELECT ep FROM tags WHERE tag = ?)")
            args.append(tag)
        return conds, args

    def _rows(self, f: Filters, *, descending: bool, limit: int,
              after: tuple[float, Any] | None) -> list[tuple[IndexRow, Any]]:
        conds, args = self._where(f)
        kc, ka = keyset_condition(descending, after, "seq", "?")
        where = " AND ".join(conds + kc) or "1"
        order = "DESC" if descending else "ASC"
        sql = f"{_SELECT_ROW} WHERE {where} ORDER BY created_at {order}, seq {order} LIMIT ?"
        with self._lock:
            got = self._db.execute(sql, [*args, *ka, limit]).fetchall()
        return [(_row(r[1:]), r[0]) for r in got]

    def _fetch(self, ids: list[str]) -> dict[str, Episode]:
        """The stored episodes among ``ids``, by id: index rows and turns read in one transaction.

        One read transaction is one WAL snapshot, so an ``expire`` committed by another process
        meanwhile is either wholly visible (the episode is absent) or not at all (it is whole).
        """
        metas: dict[str, tuple[int, int, str]] = {}
        bodies: dict[int, list[dict[str, Any]]] = {}
        with gc_paused():  # a page of 100 episodes is ~100k new objects: no collections meanwhile
            with self._lock:
                self._db.execute("BEGIN")
                try:
                    for i in range(0, len(ids), _CHUNK):
                        part = ids[i:i + _CHUNK]
                        marks = ",".join("?" * len(part))
                        for seq, eid, sv, meta in self._db.execute(
                                f"SELECT seq, episode_id, schema_version, meta FROM episodes WHERE episode_id IN ({marks})",
                                part):
                            check_schema_version(eid, sv)  # before decoding turns a newer arborl wrote
                            metas[eid] = (seq, sv, meta)
                        bodies.update(read_turns(self._db, [metas[e][0] for e in part if e in metas], self._legacy))
                finally:
                    self._db.execute("COMMIT")
            return {eid: episode_from(eid, sv, meta, bodies.get(seq, [])) for eid, (seq, sv, meta) in metas.items()}

    def slice(self, episode_id: str, start: int = 0, stop: int | None = None) -> list[Turn]:
        """Turns ``start..stop-1`` along the main path, reading only those turn rows.

        Negative indexes are not supported (the path length is ``IndexRow.n_turns``).
        """
        if start < 0 or (stop is not None and stop < 0):
            raise ValueError("slice takes non-negative start/stop; read n_turns from the index row for the length")
        with self._lock:
            self._db.execute("BEGIN")  # the index row and the turns from one snapshot
            try:
                head = self._db.execute(
                    "SELECT seq, schema_version FROM episodes WHERE episode_id = ?", (episode_id,)).fetchone()
                if head is None:
                    raise EpisodeNotFound(episode_id)
                check_schema_version(episode_id, head[1])
                tds = read_path(self._db, head[0], start, stop, self._legacy)
            finally:
                self._db.execute("COMMIT")
        return turns_from(episode_id, head[1], tds)

    def count(self, **filters: Any) -> int:
        """Number of matching episodes."""
        conds, args = self._where(Filters.make(**filters))
        with self._lock:
            return self._db.execute(
                f"SELECT COUNT(*) FROM episodes WHERE {' AND '.join(conds) or '1'}", args).fetchone()[0]

    def index_row(self, episode_id: str) -> IndexRow:
        """The index row of one episode."""
        with self._lock:
            r = self._db.execute(f"{_SELECT_ROW} WHERE episode_id = ?", (episode_id,)).fetchone()
        if r is None:
            raise EpisodeNotFound(episode_id)
        return _row(r[1:])

    def profile(self, group_by: Sequence[str] = ("task_type", "policy_version"), **filters: Any) -> list[ProfileRow]:
        """Count, success rate, mean reward and mean turns per group (sorted by group)."""
        cols = check_group_by(group_by)
        conds, args = self._where(Filters.make(**filters))
        sel = ", ".join(cols)
        sql = (f"SELECT {sel + ', ' if sel else ''}COUNT(*), COUNT(success), SUM(success), AVG(reward), "
               f"AVG(n_turns) FROM episodes WHERE {' AND '.join(conds) or '1'}"
               + (f" GROUP BY {sel} ORDER BY {sel}" if sel else ""))
        with self._lock:
            got = self._db.execute(sql, args).fetchall()
        out = []
        for r in got:
            g = dict(zip(cols, r[:len(cols)], strict=True))
            n, n_scored, n_succ, mean_r, mean_t = r[len(cols):]
            if n == 0:
                continue
            out.append(ProfileRow(g, n, n_scored, (n_succ / n_scored) if n_scored else None, mean_r, mean_t))
        return out

    # --- retention -----------------------------------------------------------------------------
    def expire(self, older_than: timedelta | None = None, task_type: str | None = None,
               now: float | None = None) -> int:
        """Delete episodes created before ``now - older_than`` (or the configured TTLs).

        Args:
            older_than: Age limit; ``None`` applies ``config.ttl_by_task_type``/``default_ttl``.
            task_type: Only this task type.
            now: Reference time (default: the current time).

        Returns:
            Number of episodes deleted. Media blobs are kept (they may be shared).
        """
        now = time.time() if now is None else now
        rules = expiry_rules(self.config, older_than, task_type)
        deleted = 0
        with self._write():
            for ttype, ttl, exclude in rules:
                conds, args = ["created_at < ?"], [now - ttl.total_seconds()]
                if ttype is not None:
                    conds.append("task_type = ?")
                    args.append(ttype)
                if exclude:
                    conds.append(f"task_type NOT IN ({','.join('?' * len(exclude))})")
                    args += exclude
                gone = self._db.execute(f"SELECT seq, tags FROM episodes WHERE {' AND '.join(conds)}", args).fetchall()
                delete_turns(self._db, [k for k, _ in gone], self._legacy)
                self._db.executemany("DELETE FROM tags WHERE tag = ? AND ep = ?",
                                     [(tag, k) for k, tags in gone for tag in set(json.loads(tags))])
                deleted += self._db.execute(f"DELETE FROM episodes WHERE {' AND '.join(conds)}", args).rowcount
        return deleted

    def close(self) -> None:
        """Close the connection and the blob store."""
        with self._lock:
            self._db.close()
        self.blobs.close()


_SQLITE_HEADER = b"SQLite format 3\x00"


def _inspect(path: Path, create: bool) -> bool:
    """Whether ``path`` is an arborl store; ``False`` for a new store (missing or empty file, with ``create``).

    Reads the file without changing it (SQLite's ``immutable`` mode takes no locks and writes no
    ``-wal``/``-shm`` files; a WAL database whose ``-wal`` file exists is being used, and is read
    as any reader reads it), and only then lets the store open it for writing.

    Raises:
        StoreError: the file is missing or empty and not ``create``, is not an SQLite database, or
            is a database that is not an arborl store.
    """
    size = path.stat().st_size if path.is_file() else None
    if size is None and path.exists():
        raise StoreError(f"{path} is not a file; point the store URL at an arborl store or a new file")
    if not size:
        if create:
            return False
        raise StoreError(f"no store at {path}" + ("" if size is None else " (the file is empty)"))
    with path.open("rb") as f:
        header = f.read(20)
    if header[:len(_SQLITE_HEADER)] != _SQLITE_HEADER:
        raise StoreError(f"{path} is not an SQLite database (it does not start with SQLite's header), so not an "
                         "arborl store; point the store URL at an arborl store or at a new file")
    # A WAL database in use (its -wal file exists) may hold its tables in the WAL only (a new store
    # before its first checkpoint): read it as any reader does, which the -wal file's owner allows.
    in_use = header[18:19] == b"\x02" and Path(f"{path}-wal").exists()
    mode = "mode=ro" if in_use else "mode=ro&immutable=1"
    db = sqlite3.connect(f"file:{quote(str(path.resolve()))}?{mode}", uri=True)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        layout = _layout_row(db) if "store_meta" in tables else None
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path} cannot be read as an SQLite database ({e}); point the store URL at an arborl "
                         "store or at a new file") from e
    finally:
        db.close()
    if not tables and create:
        return False  # an SQLite database with nothing in it: safe to make a store of
    if layout is None or "episodes" not in tables:
        shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
        raise StoreError(f"{path} is an SQLite database but not an arborl store (its tables: {shown or 'none'}); "
                         "arborl writes nothing into it: point the store URL at an arborl store or at a new file")
    return True


def _layout_row(db: sqlite3.Connection) -> tuple[str] | None:
    try:
        return db.execute("SELECT value FROM store_meta WHERE key = 'layout_version'").fetchone()
    except sqlite3.OperationalError:  # a foreign table that happens to be called store_meta
        return None


class _Tx:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) under the connection lock."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> None:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.lock.release()
            raise

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()
