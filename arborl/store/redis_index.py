"""Redis trajectory store: a hot, in-memory index with episode bodies in a blob store.

Keys (``P`` is the ``prefix``, default ``arborl``):

* ``P:ep:<id>`` hash: ``row`` (the index row as JSON) and ``content_hash``.
* ``P:hash:<sha256>`` string: the id stored for that content (deduplication).
* ``P:type:<task_type>`` and ``P:all`` sorted sets of ids scored by ``created_at``.
* ``P:types`` set of task types; ``P:bodies`` sorted set of body URLs scored by their expiry.

Bodies are written to the blob store *before* the index (so a crash leaves at most an
unreferenced blob, never an index entry without its body). The index entries of one
``put_many`` are written by one Lua script, which Redis runs atomically: dedup check, conflict
check and all writes happen with no other client in between, so concurrent writers neither
lose nor duplicate episodes. With a TTL configured for a task type, ``P:ep`` and ``P:hash``
keys get ``EXPIREAT created_at + ttl``; ``expire()`` then also sweeps sorted-set members and
bodies whose keys Redis already dropped.

Limits, by design of a hot index: filters other than task type and time are evaluated in
Python on the rows the sorted set yields; ``profile`` reads every matching row; ``slice``
fetches the whole body blob (one GET) and decodes only the requested turns; ties in
``created_at`` are ordered by episode id. Durability is whatever the server's RDB/AOF settings
give; use PostgreSQL as the system of record.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from arborl.store.base import (
    EpisodeNotFound,
    Filters,
    IndexRow,
    StoreConfig,
    StoreError,
)
from arborl.store.blob import BlobStore
from arborl.store.blob_index import BlobIndexStore
from arborl.store.codec import dedup_batch, prepare_many, to_blob
from arborl.store.common import expiry_rules
from arborl.store.url import one_line, redact, redact_secret
from arborl.trajectory.schema import Episode, SchemaError

LAYOUT_VERSION = 1
_CHUNK = 512

# ARGV: prefix, n, then per episode: id, content_hash, task_type, created_at, expire_at (0: none), row JSON, body URL.
_PUT_LUA = """
local p, n = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 0, n - 1 do
  local b = 3 + i * 7
  local id, h = ARGV[b], ARGV[b + 1]
  local ex = redis.call('GET', p .. ':hash:' .. h)
  if ex then
    out[i + 1] = ex
  else
    local other = redis.call('HGET', p .. ':ep:' .. id, 'content_hash')
    if other and other ~= h then return redis.error_reply('CONFLICT ' .. id) end
    out[i + 1] = ''
  end
end
for i = 0, n - 1 do
  if out[i + 1] == '' then
    local b = 3 + i * 7
    local id, h, tt, created, exp, row, body = ARGV[b], ARGV[b+1], ARGV[b+2], ARGV[b+3], tonumber(ARGV[b+4]), ARGV[b+5], ARGV[b+6]
    redis.call('SET', p .. ':hash:' .. h, id)
    redis.call('HSET', p .. ':ep:' .. id, 'row', row, 'content_hash', h)
    redis.call('ZADD', p .. ':type:' .. tt, created, id)
    redis.call('ZADD', p .. ':all', created, id)
    redis.call('SADD', p .. ':types', tt)
    redis.call('ZADD', p .. ':bodies', exp > 0 and exp or '+inf', body)
    if exp > 0 then
      redis.call('EXPIREAT', p .. ':hash:' .. h, exp)
      redis.call('EXPIREAT', p .. ':ep:' .. id, exp)
    end
    out[i + 1] = id
  end
end
return out
"""


class RedisStore(BlobIndexStore):
    """Trajectory index in Redis with bodies in a blob store.

    Args:
        url: ``redis://host:port/db``.
        blobs: Blob store for bodies and media (required: Redis holds only the index).
        config: TTLs (applied as EXPIREAT at write time, and by :meth:`expire`).
        prefix: Key prefix, so several stores can share one Redis database.
        create: Start a store under ``prefix`` if there is none.
        read_only: Write nothing (not even the layout record); refuse a missing store.

    Raises:
        StoreError: the server cannot be reached or refuses the password (one line, redacted),
            there is no store under ``prefix`` (and not ``create``), or the keys under ``prefix``
            are not an arborl store.
    """

    def __init__(self, url: str, blobs: BlobStore | None, config: StoreConfig | None = None,
                 prefix: str = "arborl", create: bool = True, read_only: bool = False) -> None:
        import redis  # optional dependency: the `store` extra

        if blobs is None:
            raise StoreError("the Redis store keeps bodies in a blob store: add ?blob=file:///dir or "
                             "?blob=s3://bucket/prefix to the URL")
        self.blobs = blobs
        self.config = config or StoreConfig()
        self.p = prefix
        self.read_only = read_only
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=10)
        try:
            self._check_layout(create and not read_only)
        except redis.RedisError as e:
            self.r.close()
            raise StoreError(f"cannot open the Redis store at {redact(url)}: {redact_secret(one_line(e), url)}") from None
        except StoreError:
            self.r.close()
            raise
        self._put_script = self.r.register_script(_PUT_LUA)
        self._pool = ThreadPoolExecutor(max_workers=8)  # body GETs from S3 are latency-bound

    def _check_layout(self, create: bool) -> None:
        """Refuse a foreign keyspace under the prefix, a missing store (unless ``create``) or a newer layout."""
        key = f"{self.p}:meta"
        kind = self.r.type(key)
        if kind == "none":
            if next(self.r.scan_iter(match=f"{self.p}:*", count=1000), None) is not None:
                raise StoreError(f"the Redis keys under prefix {self.p!r} are not an arborl store (no {key} record); "
                                 "arborl writes nothing there: choose another ?prefix= or database")
            if not create:
                raise StoreError(f"no arborl store with prefix {self.p!r} in this Redis database; check ?prefix= "
                                 "and the database number")
            self.r.hsetnx(key, "layout_version", LAYOUT_VERSION)
            return
        version = self.r.hget(key, "layout_version") if kind == "hash" else None
        if version is None:
            raise StoreError(f"the Redis key {key} is a {kind} without a layout_version, not an arborl store record; "
                             "arborl writes nothing there: choose another ?prefix= or database")
        if int(version) > LAYOUT_VERSION:
            raise StoreError(f"Redis index {self.p!r} has layout version {version}, written by a newer arborl; "
                             f"this arborl reads layout <= {LAYOUT_VERSION}. Upgrade arborl to open it.")

    # --- write ---------------------------------------------------------------------------------
    def put_many(self, episodes: Iterable[Episode | dict[str, Any]]) -> list[str]:
        """Store episodes: bodies to the blob store, then all index entries in one atomic script.

        Returns:
            One id per input episode: its own id, or the id already stored for the same content.

        Raises:
            SchemaError: an episode is malformed, or reuses a stored episode_id for other content.
                No index entry from the call is written.
        """
        import redis

        self._writable()
        prepared = prepare_many(episodes)
        unique, alias = dedup_batch(prepared)
        if not unique:
            return []
        urls = list(self._pool.map(lambda p: self.blobs.put(zlib.compress(to_blob(p), 1)), unique))
        argv: list[Any] = [self.p, len(unique)]
        for p, url in zip(unique, urls, strict=True):
            p.row.body_url = url
            ttl = self.config.ttl_for(p.row.task_type)
            exp = 0 if ttl is None else int(p.row.created_at + ttl.total_seconds()) + 1
            argv += [p.row.episode_id, p.row.content_hash, p.row.task_type, repr(p.row.created_at), exp,
                     json.dumps(p.row.to_dict()), url]
        try:
            got = self._put_script(args=argv)
        except redis.ResponseError as e:
            if "CONFLICT" not in str(e):
                raise
            eid = str(e).split("CONFLICT ", 1)[1].strip()
            raise SchemaError(f"episode_id {eid} is already stored with different content; episodes are "
                              "immutable, so store the new version under a new episode_id") from e
        stored = {p.row.content_hash: eid for p, eid in zip(unique, got, strict=True)}
        by_id = {p.row.episode_id: p.row.content_hash for p in unique}
        return [stored[by_id[alias.get(p.row.episode_id, p.row.episode_id)]] for p in prepared]

    # --- read ----------------------------------------------------------------------------------
    def _key(self, f: Filters) -> str:
        return f"{self.p}:type:{f.task_type}" if f.task_type is not None else f"{self.p}:all"

    def _scan(self, f: Filters, descending: bool, after: tuple[float, Any] | None) -> Iterator[IndexRow]:
        """Rows in (created_at, id) order after the keyset position, filtered client-side."""
        lo = "-inf" if f.since is None else repr(f.since)
        hi = "+inf" if f.until is None else f"({f.until!r}"
        if after is not None:
            if descending:
                hi = repr(after[0]) if f.until is None or after[0] < f.until else hi
            else:
                lo = repr(after[0]) if f.since is None or after[0] > f.since else lo
        key, offset = self._key(f), 0
        while True:
            if descending:
                batch = self.r.zrange(key, hi, lo, byscore=True, desc=True, offset=offset, num=_CHUNK,
                                      withscores=True)
            else:
                batch = self.r.zrange(key, lo, hi, byscore=True, offset=offset, num=_CHUNK, withscores=True)
            offset += len(batch)
            got = batch
            if after is not None:  # drop the rows at the cursor's time up to and including the cursor
                c, cid = after
                got = [(m, s) for m, s in got if s != c or (m < cid if descending else m > cid)]
            pipe = self.r.pipeline(transaction=False)
            for m, _ in got:
                pipe.hget(f"{self.p}:ep:{m}", "row")
            for raw in pipe.execute():
                if raw is not None:  # None: TTL passed, swept by the next expire()
                    row = IndexRow(**json.loads(raw))
                    if f.matches(row):
                        yield row
            if len(batch) < _CHUNK:
                return

    def _index_rows(self, ids: list[str]) -> list[IndexRow]:
        pipe = self.r.pipeline(transaction=False)
        for eid in ids:
            pipe.hget(f"{self.p}:ep:{eid}", "row")
        return [IndexRow(**json.loads(raw)) for raw in pipe.execute() if raw is not None]

    def _indexed(self, episode_id: str) -> bool:
        return bool(self.r.exists(f"{self.p}:ep:{episode_id}"))

    def index_row(self, episode_id: str) -> IndexRow:
        """The index row of one episode."""
        raw = self.r.hget(f"{self.p}:ep:{episode_id}", "row")
        if raw is None:
            raise EpisodeNotFound(episode_id)
        return IndexRow(**json.loads(raw))

    def count(self, **filters: Any) -> int:
        """Number of matching episodes (ZCOUNT when only task type and time are filtered)."""
        f = Filters.make(**filters)
        if Filters(task_type=f.task_type, since=f.since, until=f.until) == f:
            lo = "-inf" if f.since is None else repr(f.since)
            hi = "+inf" if f.until is None else f"({f.until!r}"
            return int(self.r.zcount(self._key(f), lo, hi))
        return sum(1 for _ in self._scan(f, True, None))

    # --- retention -----------------------------------------------------------------------------
    def expire(self, older_than: timedelta | None = None, task_type: str | None = None,
               now: float | None = None) -> int:
        """Delete episodes created before ``now - older_than`` (or the configured TTLs).

        Also removes sorted-set members and body blobs of episodes whose keys Redis already
        expired. Returns the number of episodes deleted by this call (including those).
        """
        self._writable()
        now = time.time() if now is None else now
        deleted = 0
        for ttype, ttl, exclude in expiry_rules(self.config, older_than, task_type):
            types = [ttype] if ttype is not None else sorted(set(self.r.smembers(f"{self.p}:types")) - set(exclude))
            for tt in types:
                ids = self.r.zrange(f"{self.p}:type:{tt}", "-inf", f"({now - ttl.total_seconds()!r}", byscore=True)
                deleted += self._delete(tt, ids)
        for url in self.r.zrange(f"{self.p}:bodies", "-inf", repr(now), byscore=True):
            self.blobs.delete(url)  # bodies of episodes whose keys Redis expired by TTL
            self.r.zrem(f"{self.p}:bodies", url)
        return deleted

    def _delete(self, task_type: str, ids: list[str]) -> int:
        for i in range(0, len(ids), _CHUNK):
            part = ids[i:i + _CHUNK]
            pipe = self.r.pipeline(transaction=False)
            for eid in part:
                pipe.hget(f"{self.p}:ep:{eid}", "row")
            rows = [json.loads(raw) for raw in pipe.execute() if raw is not None]
            pipe = self.r.pipeline(transaction=True)
            for row in rows:
                pipe.delete(f"{self.p}:hash:{row['content_hash']}", f"{self.p}:ep:{row['episode_id']}")
                pipe.zrem(f"{self.p}:bodies", row["body_url"])
            pipe.zrem(f"{self.p}:type:{task_type}", *part)
            pipe.zrem(f"{self.p}:all", *part)
            pipe.execute()
            for row in rows:  # bodies last: a crash in between leaves a stray blob, never a dangling index entry
                self.blobs.delete(row["body_url"])
        return len(ids)

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"the Redis store {self.p!r} was opened read-only; open it without read_only to write")

    def close(self) -> None:
        """Close the connection pool, worker threads and the blob store."""
        self._pool.shutdown()
        self.r.close()
        self.blobs.close()
