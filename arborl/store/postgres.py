"""PostgreSQL trajectory store: the durable, shared tier (psycopg 3, psycopg_pool, COPY ingest).

Layout (``layout_version`` in ``arborl_meta``; a newer layout is refused on open):

* ``arborl_keys``: one small row per episode: ``episode_id`` (primary key), ``content_hash``
  (unique), ``created_at`` and ``seq`` (identity; insertion order and keyset tiebreak). It is
  never partitioned, so it enforces global uniqueness of ids and content for both layouts.
* ``arborl_episodes``: the index row (typed columns, ``tags text[]``) plus ``meta jsonb``
  (the episode without its turns). Indexes: (task_type, created_at, seq), (created_at, seq),
  (policy_version, created_at), (reward), (source, iteration), GIN(tags).
* ``arborl_turns``: one row per turn (``body jsonb``) keyed by (episode seq, turn seq), with
  the main-path position, so ``slice`` reads only the rows it returns.

``created_at`` is stored as unix seconds (``double precision``), as in the episode record.

**Time partitioning** (the >1M tier): open with ``?partitioned=month`` (or ``day``/``week``)
*when the store is created*. ``arborl_episodes`` and ``arborl_turns`` are then declared
``PARTITION BY RANGE (created_at)`` and one partition per period is created on demand at write
time (under an advisory lock, so concurrent writers do not race). Queries with a time range
touch only the partitions in range, and ``expire`` without a task type drops whole partitions
that lie entirely before the cutoff (instant, no vacuum) before deleting the rest row by row.

Ingest: one transaction per ``put_many``: keys are claimed with ``INSERT ... ON CONFLICT DO
NOTHING`` (rows sorted by content hash so concurrent writers lock in the same order; a detected
deadlock or serialization failure is retried), then index rows and turns go in with ``COPY``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from arborl.store.base import (
    EpisodeNotFound,
    Filters,
    IndexRow,
    ProfileRow,
    StoreConfig,
    StoreError,
    check_group_by,
)
from arborl.store.blob import BlobStore, NoBlobStore
from arborl.store.codec import Prepared, dedup_batch, episode_from, prepare_many, turn_dict, turns_from
from arborl.store.common import BaseStore, expiry_rules, keyset_condition, sql_where
from arborl.store.pg_layout import LAYOUT_VERSION, PERIODS, ensure_partitions, install_layout, old_partitions
from arborl.store.url import one_line, redact, redact_secret
from arborl.trajectory.schema import Episode, SchemaError, Turn

ROW_COLUMNS = ("episode_id", "task_id", "task_type", "group_id", "source", "iteration", "policy_version",
               "reward", "success", "n_turns", "n_nodes", "stop_reason", "content_hash", "created_at",
               "tags", "schema_version")
_SELECT_ROW = "SELECT seq, " + ", ".join(ROW_COLUMNS) + " FROM arborl_episodes"
_RETRIES = 5


class PostgresStore(BaseStore):
    """Trajectory store in PostgreSQL.

    Args:
        conninfo: libpq URL, e.g. ``postgresql://user@host:5432/db``.
        blobs: Blob store for media (default: none; media calls then raise with the fix).
        config: TTLs and other shared settings.
        pool_min: Connections kept open.
        pool_max: Most connections open at once (threads share the pool).
        partitioned: ``None`` (plain tables) or "day"/"week"/"month": time-partition a *new*
            store by ``created_at``. An existing store keeps the layout it was created with.
        create: Create the tables in a database that has no arborl store yet.
        read_only: Every transaction is read-only (``default_transaction_read_only``); nothing is
            created.

    Raises:
        StoreError: the server cannot be reached or refuses the login (one line, password
            redacted, after at most ``connect_timeout_s``), or the database holds no arborl
            store (and not ``create``), or ``arborl_`` tables that are not an arborl store.
    """

    def __init__(self, conninfo: str, blobs: BlobStore | None = None, config: StoreConfig | None = None,
                 pool_min: int = 1, pool_max: int = 4, partitioned: str | None = None, create: bool = True,
                 read_only: bool = False, connect_timeout_s: int = 10) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool  # optional dependency: the `store` extra

        if partitioned is not None and partitioned not in PERIODS:
            raise StoreError(f"partitioned must be one of {sorted(PERIODS)}, got {partitioned!r}")
        self.blobs = blobs or NoBlobStore(
            "this PostgreSQL store has no blob store for media: add ?blob=file:///dir or ?blob=s3://bucket/prefix")
        self.config = config or StoreConfig()
        self.read_only = read_only
        kwargs: dict[str, Any] = {"autocommit": False, "client_encoding": "utf8"}
        if read_only:
            kwargs["options"] = "-c default_transaction_read_only=on"
        # One direct connection first: a wrong password or an unreachable server is one clear error
        # now, not a pool that retries in the background until its 30 s timeout.
        try:
            with psycopg.connect(conninfo, connect_timeout=connect_timeout_s, **kwargs) as conn:
                self.period = install_layout(conn, partitioned, create=create and not read_only)
        except psycopg.Error as e:
            raise StoreError(f"cannot open the PostgreSQL store at {redact(conninfo)}: "
                             f"{redact_secret(one_line(e), conninfo)}") from None
        self.pool = ConnectionPool(conninfo, min_size=pool_min, max_size=pool_max, open=True, kwargs=kwargs)

    # --- write ---------------------------------------------------------------------------------
    def put_many(self, episodes: Iterable[Episode | dict[str, Any]]) -> list[str]:
        """Store episodes in one transaction; duplicates (same content hash) are not stored twice.

        Returns:
            One id per input episode: its own id, or the id already stored for the same content.

        Raises:
            SchemaError: an episode is malformed, or reuses a stored episode_id for other content.
                Nothing from the call is stored.
        """
        import psycopg

        self._writable()
        prepared = prepare_many(episodes)
        unique, alias = dedup_batch(prepared)
        for attempt in range(_RETRIES):
            try:
                with self.pool.connection() as conn:
                    existing = self._put(conn, unique)
                break
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                if attempt == _RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        return [existing.get(p.row.content_hash, alias.get(p.row.episode_id, p.row.episode_id)) for p in prepared]

    def _put(self, conn: Any, unique: list[Prepared]) -> dict[str, str]:
        if not unique:
            return {}
        cur = conn.cursor()
        # seq follows the batch order (the tiebreak for equal created_at), while rows are inserted in
        # content-hash order so that concurrent writers take the unique-index locks in one order.
        cur.execute("SELECT nextval(pg_get_serial_sequence('arborl_keys', 'seq')) FROM generate_series(1, %s)",
                    (len(unique),))
        seqs = sorted(r[0] for r in cur.fetchall())
        order = sorted(range(len(unique)), key=lambda i: unique[i].row.content_hash)
        cur.execute(
            "INSERT INTO arborl_keys(episode_id, content_hash, created_at, seq) SELECT * FROM "
            "unnest(%s::text[], %s::text[], %s::float8[], %s::int8[]) ON CONFLICT DO NOTHING RETURNING episode_id, seq",
            ([unique[i].row.episode_id for i in order], [unique[i].row.content_hash for i in order],
             [unique[i].row.created_at for i in order], [seqs[i] for i in order]))
        seq_of = dict(cur.fetchall())
        lost = [p for p in unique if p.row.episode_id not in seq_of]
        existing: dict[str, str] = {}
        if lost:
            cur.execute("SELECT content_hash, episode_id FROM arborl_keys WHERE content_hash = ANY(%s)",
                        ([p.row.content_hash for p in lost],))
            existing = dict(cur.fetchall())
            for p in lost:
                if p.row.content_hash not in existing:
                    raise SchemaError(
                        f"episode_id {p.row.episode_id} is already stored with different content; episodes "
                        "are immutable, so store the new version under a new episode_id")
        new = [p for p in unique if p.row.episode_id in seq_of]
        if self.period:
            ensure_partitions(cur, self.period, [p.row.created_at for p in new])
        self._copy(cur, new, seq_of)
        return existing

    def _copy(self, cur: Any, new: list[Prepared], seq_of: dict[str, int]) -> None:
        with cur.copy("COPY arborl_episodes (seq, " + ", ".join(ROW_COLUMNS) + ", meta) FROM STDIN") as cp:
            for p in new:
                r = p.row
                cp.write_row((seq_of[r.episode_id], r.episode_id, r.task_id, r.task_type, r.group_id, r.source,
                              r.iteration, r.policy_version, r.reward, r.success, r.n_turns, r.n_nodes,
                              r.stop_reason, r.content_hash, r.created_at, r.tags, r.schema_version, p.meta))
        with cur.copy("COPY arborl_turns (ep, created_at, seq, path_index, turn_id, parent_id, reward, timings, "
                      "body) FROM STDIN") as cp:
            for p in new:
                k, c = seq_of[p.row.episode_id], p.row.created_at
                for t in p.turn_rows():
                    cp.write_row((k, c, t.seq, t.path_index, t.turn_id, t.parent_id, t.reward, t.timings, t.body))

    # --- read ----------------------------------------------------------------------------------
    def _where(self, f: Filters) -> tuple[list[str], list[Any]]:
        conds, args = sql_where(f, "%s")
        if f.tags:
            conds.append("tags @> %s::text[]")
            args.append(list(f.tags))
        return conds, args

    def _rows(self, f: Filters, *, descending: bool, limit: int,
              after: tuple[float, Any] | None) -> list[tuple[IndexRow, Any]]:
        conds, args = self._where(f)
        kc, ka = keyset_condition(descending, after, "seq", "%s")
        where = " AND ".join(conds + kc) or "TRUE"
        order = "DESC" if descending else "ASC"
        sql = f"{_SELECT_ROW} WHERE {where} ORDER BY created_at {order}, seq {order} LIMIT %s"
        with self.pool.connection() as conn:
            got = conn.execute(sql, [*args, *ka, limit]).fetchall()
        return [(IndexRow(*r[1:]), r[0]) for r in got]

    def _fetch(self, ids: list[str]) -> dict[str, Episode]:
        """Index rows and turns of ``ids`` from one REPEATABLE READ snapshot (an expire is all or nothing)."""
        with self.pool.connection() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            heads = conn.execute(
                "SELECT e.episode_id, e.seq, e.schema_version, e.meta FROM arborl_keys k JOIN arborl_episodes e "
                "ON e.seq = k.seq AND e.created_at = k.created_at WHERE k.episode_id = ANY(%s)", (ids,)).fetchall()
            turns: dict[int, list[dict[str, Any]]] = {}
            for ep, tid, pid, tim, body in conn.execute(
                    "SELECT t.ep, t.turn_id, t.parent_id, t.timings, t.body FROM arborl_turns t JOIN arborl_keys k "
                    "ON t.ep = k.seq AND t.created_at = k.created_at WHERE k.episode_id = ANY(%s) "
                    "ORDER BY t.ep, t.seq", (ids,)):
                turns.setdefault(ep, []).append(turn_dict(tid, pid, tim, body))
        return {eid: episode_from(eid, sv, meta, turns.get(seq, [])) for eid, seq, sv, meta in heads}

    def index_row(self, episode_id: str) -> IndexRow:
        """The index row of one episode."""
        with self.pool.connection() as conn:
            r = conn.execute(f"{_SELECT_ROW} e WHERE (e.seq, e.created_at) = (SELECT seq, created_at FROM arborl_keys "
                             "WHERE episode_id = %s)", (episode_id,)).fetchone()
        if r is None:
            raise EpisodeNotFound(episode_id)
        return IndexRow(*r[1:])

    def slice(self, episode_id: str, start: int = 0, stop: int | None = None) -> list[Turn]:
        """Turns ``start..stop-1`` along the main path, reading only those turn rows."""
        if start < 0 or (stop is not None and stop < 0):
            raise ValueError("slice takes non-negative start/stop; read n_turns from the index row for the length")
        with self.pool.connection() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            head = conn.execute(
                "SELECT k.seq, k.created_at, e.schema_version FROM arborl_keys k JOIN arborl_episodes e "
                "ON e.seq = k.seq AND e.created_at = k.created_at WHERE k.episode_id = %s", (episode_id,)).fetchone()
            if head is None:
                raise EpisodeNotFound(episode_id)
            tds = [turn_dict(*r) for r in conn.execute(
                "SELECT turn_id, parent_id, timings, body FROM arborl_turns WHERE ep = %s AND created_at = %s "
                "AND path_index >= %s AND path_index < %s ORDER BY path_index",
                (head[0], head[1], start, 2**62 if stop is None else stop))]
        return turns_from(episode_id, head[2], tds)

    def count(self, **filters: Any) -> int:
        """Number of matching episodes."""
        conds, args = self._where(Filters.make(**filters))
        with self.pool.connection() as conn:
            return conn.execute(f"SELECT COUNT(*) FROM arborl_episodes WHERE {' AND '.join(conds) or 'TRUE'}",
                                args).fetchone()[0]

    def profile(self, group_by: Sequence[str] = ("task_type", "policy_version"), **filters: Any) -> list[ProfileRow]:
        """Count, success rate, mean reward and mean turns per group (sorted by group)."""
        cols = check_group_by(group_by)
        conds, args = self._where(Filters.make(**filters))
        sel = ", ".join(cols)
        sql = (f"SELECT {sel + ', ' if sel else ''}COUNT(*), COUNT(success), SUM(success::int), AVG(reward), "
               f"AVG(n_turns)::float8 FROM arborl_episodes WHERE {' AND '.join(conds) or 'TRUE'}"
               + (f" GROUP BY {sel} ORDER BY {sel}" if sel else ""))
        with self.pool.connection() as conn:
            got = conn.execute(sql, args).fetchall()
        out = []
        for r in got:
            n, n_scored, n_succ, mean_r, mean_t = r[len(cols):]
            if n:
                out.append(ProfileRow(dict(zip(cols, r[:len(cols)], strict=True)), n, n_scored,
                                      (n_succ / n_scored) if n_scored else None, float(mean_r), float(mean_t)))
        return out

    # --- retention -----------------------------------------------------------------------------
    def expire(self, older_than: timedelta | None = None, task_type: str | None = None,
               now: float | None = None) -> int:
        """Delete episodes created before ``now - older_than`` (or the configured TTLs).

        With time partitioning and no task type, whole partitions older than the cutoff are
        dropped first. Returns the number of episodes deleted; media blobs are kept.
        """
        self._writable()
        now = time.time() if now is None else now
        deleted = 0
        with self.pool.connection() as conn:
            cur = conn.cursor()
            for ttype, ttl, exclude in expiry_rules(self.config, older_than, task_type):
                cutoff = now - ttl.total_seconds()
                if self.period and ttype is None and not exclude:
                    for ep_part, turn_part in old_partitions(cur, cutoff):
                        n = cur.execute(f"SELECT COUNT(*) FROM {ep_part}").fetchone()[0]
                        cur.execute(f"DELETE FROM arborl_keys k USING {ep_part} e WHERE k.seq = e.seq")
                        cur.execute(f"DROP TABLE {ep_part}, {turn_part}")
                        deleted += n
                conds, args = ["created_at < %s"], [cutoff]
                if ttype is not None:
                    conds.append("task_type = %s")
                    args.append(ttype)
                if exclude:
                    conds.append("NOT (task_type = ANY(%s))")
                    args.append(exclude)
                cur.execute(f"WITH gone AS (DELETE FROM arborl_episodes WHERE {' AND '.join(conds)} "
                            "RETURNING seq, created_at), t AS (DELETE FROM arborl_turns USING gone "
                            "WHERE arborl_turns.ep = gone.seq AND arborl_turns.created_at = gone.created_at), "
                            "k AS (DELETE FROM arborl_keys USING gone WHERE arborl_keys.seq = gone.seq) "
                            "SELECT COUNT(*) FROM gone", args)
                deleted += cur.fetchone()[0]
        return deleted

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError("this PostgreSQL store was opened read-only; open it without read_only to write")

    def close(self) -> None:
        """Close the pool and the blob store."""
        self.pool.close()
        self.blobs.close()


__all__ = ["LAYOUT_VERSION", "PostgresStore"]
