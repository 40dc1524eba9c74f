"""DynamoDB trajectory store: a serverless, horizontally scaled index with bodies in a blob store.

One table, keys ``pk`` (partition) and ``sk`` (sort), every value a string:

* ``pk="meta", sk="meta"``: ``layout_version``, the set ``types`` of stored task types and the
  set ``days`` of UTC days (``created_at // 86400``) that hold episodes.
* ``pk="ep#<id>", sk="row"``: one episode's index row (``row``, JSON), its ``content_hash``,
  ``body_url``, ``exp`` (exact expiry in unix seconds, ``0``: none), ``ttl`` (DynamoDB's native
  TTL attribute: ``exp`` plus :data:`TTL_GRACE`, a backstop) and the GSI keys below.
* ``pk="hash#<sha256>", sk="hash"``: ``episode_id`` stored for that content (deduplication).

Four sparse global secondary indexes over episode items, all sorted by ``ts`` (the order-preserving
hex form of ``created_at``, then ``#<episode_id>``, so ties are ordered by episode id) and
projecting every attribute: ``by_type`` (``g_type`` = task type), ``by_policy`` (``g_policy`` =
policy version), ``by_source_iter`` (``g_si`` = ``source#iteration``) and ``by_day`` (``g_day`` =
UTC day, so no single partition takes every write). A query reads the one index its filters
select, newest or oldest first, the remaining filters applied in Python to the returned rows; a
cursor is the last row's position, sent back as ``ExclusiveStartKey``.

Writes: bodies go to the blob store first (a crash leaves at most an unreferenced blob). Then
the hash and episode items of up to :data:`_TXN` episodes are written by one
``TransactWriteItems`` whose conditions (``attribute_not_exists(pk)``, or the item has expired)
make a concurrent writer of the same content or id fail the transaction instead of overwriting;
the writer then rereads those keys and stores what is still new, so concurrent writers neither
lose nor duplicate episodes. A ``put_many`` of more than :data:`_TXN` new episodes is atomic per
transaction, not as a whole (DynamoDB allows 100 items per transaction). Reads of whole episodes
(``BatchGetItem``, strongly consistent, unprocessed keys retried) see an episode whole or not at
all; queries read the GSIs, which are eventually consistent on AWS.

Expiry: ``expire()`` deletes episode and hash items in transactions, then the bodies. An item
past ``exp`` is treated as absent by every read; DynamoDB's own TTL sweep (on ``ttl``, a day
later) removes items nobody expired, but not their bodies: give the body prefix an S3 lifecycle
rule if ``expire()`` is not run.
"""

from __future__ import annotations

import contextlib
import json
import struct
import time
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from botocore.exceptions import ClientError

from arborl.store.base import (
    EpisodeNotFound,
    Filters,
    IndexRow,
    StoreConfig,
    StoreError,
)
from arborl.store.blob import BlobStore
from arborl.store.blob_index import BlobIndexStore
from arborl.store.codec import Prepared, dedup_batch, prepare_many, to_blob
from arborl.store.common import expiry_rules
from arborl.store.url import one_line, redact, redact_secret
from arborl.trajectory.schema import Episode, SchemaError

LAYOUT_VERSION = 1
TTL_GRACE = 86400
"""Seconds after an item's expiry at which DynamoDB's native TTL may delete it."""
_TXN = 45
"""Episodes per transaction: two items each, plus the meta item, within DynamoDB's 100."""
_INDEXES = {"by_type": "g_type", "by_policy": "g_policy", "by_source_iter": "g_si", "by_day": "g_day"}
_META = {"pk": {"S": "meta"}, "sk": {"S": "meta"}}
_TOP = "g"  # above every hex digit: the open upper end of a ts range


def _tkey(t: float) -> str:
    """``t`` as 16 hex digits whose string order is the numeric order (IEEE 754 bits, sign-folded)."""
    bits = struct.unpack(">Q", struct.pack(">d", t))[0]
    return f"{bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63:016x}"


def _ep_key(eid: str) -> dict[str, Any]:
    return {"pk": {"S": f"ep#{eid}"}, "sk": {"S": "row"}}


def _hash_key(h: str) -> dict[str, Any]:
    return {"pk": {"S": f"hash#{h}"}, "sk": {"S": "hash"}}


def _day(t: float) -> str:
    return str(int(t // 86400))


def _index_for(f: Filters) -> tuple[str, str | None]:
    """The GSI that narrows ``f`` most, and its partition value (``None``: by_day, one per day)."""
    if f.source is not None and f.iteration is not None:
        return "by_source_iter", f"{f.source}#{f.iteration}"
    if f.policy_version is not None:
        return "by_policy", str(f.policy_version)
    if f.task_type is not None:
        return "by_type", f.task_type
    return "by_day", None


class DynamoDBStore(BlobIndexStore):
    """Trajectory index in one DynamoDB table with bodies in a blob store.

    Args:
        table: Table name.
        blobs: Blob store for bodies and media (required: items hold only the index).
        config: TTLs (written as each item's expiry, and applied by :meth:`expire`).
        endpoint: Endpoint URL of a DynamoDB-compatible server (``None``: AWS).
        region: AWS region (``None``: from the environment or AWS config).
        create: Create the table (pay per request, with its indexes and TTL) if it is missing.
        read_only: Write nothing; refuse a missing table.

    Credentials come from boto3's usual chain (environment, config files, instance role), never
    from the URL, and appear in no message.

    Raises:
        StoreError: the endpoint cannot be reached or refuses the credentials (one line), the table
            is missing (and not ``create``), or it is not an arborl store.
    """

    def __init__(self, table: str, blobs: BlobStore | None, config: StoreConfig | None = None,
                 endpoint: str | None = None, region: str | None = None, create: bool = True,
                 read_only: bool = False) -> None:
        import boto3  # optional dependency: the `store` extra
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        if blobs is None:
            raise StoreError("the DynamoDB store keeps bodies in a blob store: add ?blob=s3://bucket/prefix "
                             "(or ?blob=file:///dir) to the URL")
        self.blobs = blobs
        self.config = config or StoreConfig()
        self.table = table
        self.read_only = read_only
        self._where = f"dynamodb://{table}" + (f" at {redact(endpoint)}" if endpoint else "")
        try:
            self.db = boto3.client("dynamodb", endpoint_url=endpoint, region_name=region, config=Config(
                connect_timeout=5, read_timeout=30, retries={"max_attempts": 4, "mode": "standard"}))
            self._open(create and not read_only)
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"cannot open the DynamoDB store {self._where}: "
                             f"{redact_secret(one_line(e), endpoint or '')}") from None
        self._pool = ThreadPoolExecutor(max_workers=8)  # body GETs from S3 are latency-bound

    # --- layout --------------------------------------------------------------------------------
    def _open(self, create: bool) -> None:
        """Check (or create) the table and its layout record; refuse a foreign or newer one."""
        try:
            desc = self.db.describe_table(TableName=self.table)["Table"]
        except self.db.exceptions.ResourceNotFoundException:
            if not create:
                raise StoreError(f"no DynamoDB table {self.table!r}; check the table name and region") from None
            self._create_table()
            desc = self.db.describe_table(TableName=self.table)["Table"]
        if desc.get("TableStatus") == "CREATING":  # another process has just created it
            self.db.get_waiter("table_exists").wait(TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        keys = sorted((k["AttributeName"], k["KeyType"]) for k in desc["KeySchema"])
        gsis = {g["IndexName"] for g in desc.get("GlobalSecondaryIndexes", [])}
        foreign = StoreError(f"the DynamoDB table {self.table!r} is not an arborl store (other keys or indexes, or "
                             "items without a layout record); arborl writes nothing there: choose another table")
        if keys != [("pk", "HASH"), ("sk", "RANGE")] or not set(_INDEXES) <= gsis:
            raise foreign
        meta = self.db.get_item(TableName=self.table, Key=_META, ConsistentRead=True).get("Item")
        if meta is None and self.db.scan(TableName=self.table, Limit=1).get("Items"):
            raise foreign
        if meta is None:
            if not create:
                raise StoreError(f"the DynamoDB table {self.table!r} holds no arborl store yet; open it writable once")
            self.db.update_item(TableName=self.table, Key=_META, UpdateExpression="SET layout_version = if_not_exists("
                                "layout_version, :v)", ExpressionAttributeValues={":v": {"N": str(LAYOUT_VERSION)}})
            return
        if int(meta["layout_version"]["N"]) > LAYOUT_VERSION:
            raise StoreError(f"DynamoDB table {self.table!r} has layout version {meta['layout_version']['N']}, written "
                             f"by a newer arborl; this arborl reads layout <= {LAYOUT_VERSION}. Upgrade arborl.")

    def _create_table(self) -> None:
        attrs = ["pk", "sk", "ts", *_INDEXES.values()]
        with contextlib.suppress(self.db.exceptions.ResourceInUseException):  # another process is creating it
            self.db.create_table(
                TableName=self.table, BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in attrs],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                GlobalSecondaryIndexes=[{
                    "IndexName": name, "Projection": {"ProjectionType": "ALL"},
                    "KeySchema": [{"AttributeName": attr, "KeyType": "HASH"}, {"AttributeName": "ts", "KeyType": "RANGE"}],
                } for name, attr in _INDEXES.items()])
        self.db.get_waiter("table_exists").wait(TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
        self.db.update_time_to_live(TableName=self.table,
                                    TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})

    # --- write ---------------------------------------------------------------------------------
    def put_many(self, episodes: Iterable[Episode | dict[str, Any]]) -> list[str]:
        """Store episodes: bodies to the blob store, then index items in conditional transactions.

        Returns:
            One id per input episode: its own id, or the id already stored for the same content.

        Raises:
            SchemaError: an episode is malformed, or reuses a stored episode_id for other content
                (checked for the whole call before anything is written).
        """
        self._writable()
        prepared = prepare_many(episodes)
        unique, alias = dedup_batch(prepared)
        if not unique:
            return []
        stored = self._existing(unique)  # content hash -> stored id, for the ones already there
        todo = [p for p in unique if p.row.content_hash not in stored]
        urls = list(self._pool.map(lambda p: self.blobs.put(zlib.compress(to_blob(p), 1)), todo))
        for p, url in zip(todo, urls, strict=True):
            p.row.body_url = url
        for i in range(0, len(todo), _TXN):
            stored.update(self._write(todo[i:i + _TXN]))
        by_id = {p.row.episode_id: p.row.content_hash for p in unique}
        return [stored[by_id[alias.get(p.row.episode_id, p.row.episode_id)]] for p in prepared]

    def _existing(self, batch: list[Prepared]) -> dict[str, str]:
        """Ids stored for the batch's contents; :class:`SchemaError` if an id holds other content."""
        now = time.time()
        keys = [_hash_key(p.row.content_hash) for p in batch] + [_ep_key(p.row.episode_id) for p in batch]
        items = {it["pk"]["S"]: it for it in self._batch_get(keys) if _live(it, now)}
        for p in batch:
            ep = items.get(f"ep#{p.row.episode_id}")
            if ep is not None and ep["content_hash"]["S"] != p.row.content_hash:
                raise SchemaError(f"episode_id {p.row.episode_id} is already stored with different content; "
                                  "episodes are immutable, so store the new version under a new episode_id")
        return {p.row.content_hash: items[f"hash#{p.row.content_hash}"]["episode_id"]["S"]
                for p in batch if f"hash#{p.row.content_hash}" in items}

    def _write(self, batch: list[Prepared]) -> dict[str, str]:
        """Write the batch's new episodes in one transaction, rereading after a lost race."""
        for attempt in range(20):
            stored = self._existing(batch) if attempt else {}
            new = [p for p in batch if p.row.content_hash not in stored]
            if not new:
                return stored
            try:
                self.db.transact_write_items(TransactItems=self._txn_items(new))
                return {**stored, **{p.row.content_hash: p.row.episode_id for p in new}}
            except ClientError as e:
                if not _lost_race(e):
                    raise
                time.sleep(0.01 * (attempt + 1))  # a concurrent writer won a key: see what it stored
        raise StoreError(f"DynamoDB table {self.table!r}: 20 transactions in a row lost to concurrent writers; retry")

    def _txn_items(self, new: list[Prepared]) -> list[dict[str, Any]]:
        now = {":now": {"N": repr(time.time())}}
        cond = "attribute_not_exists(pk) OR (exp > :zero AND exp <= :now)"
        values = {**now, ":zero": {"N": "0"}}
        out: list[dict[str, Any]] = []
        for p in new:
            r = p.row
            ttl = self.config.ttl_for(r.task_type)
            exp = 0 if ttl is None else int(r.created_at + ttl.total_seconds()) + 1
            common = {"exp": {"N": str(exp)}, **({"ttl": {"N": str(exp + TTL_GRACE)}} if exp else {})}
            ep = {**_ep_key(r.episode_id), **common, "row": {"S": json.dumps(r.to_dict())},
                  "content_hash": {"S": r.content_hash}, "ts": {"S": f"{_tkey(r.created_at)}#{r.episode_id}"},
                  "g_type": {"S": r.task_type}, "g_policy": {"S": str(r.policy_version)},
                  "g_si": {"S": f"{r.source}#{r.iteration}"}, "g_day": {"S": _day(r.created_at)}}
            h = {**_hash_key(r.content_hash), **common, "episode_id": {"S": r.episode_id}}
            out += [{"Put": {"TableName": self.table, "Item": it, "ConditionExpression": cond,
                             "ExpressionAttributeValues": values}} for it in (h, ep)]
        out.append({"Update": {
            "TableName": self.table, "Key": _META, "UpdateExpression": "ADD #t :t, #d :d",
            "ExpressionAttributeNames": {"#t": "types", "#d": "days"},
            "ExpressionAttributeValues": {":t": {"SS": sorted({p.row.task_type for p in new})},
                                          ":d": {"SS": sorted({_day(p.row.created_at) for p in new})}}}})
        return out

    # --- read ----------------------------------------------------------------------------------
    def _batch_get(self, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Items for ``keys`` (strongly consistent, 100 per request, unprocessed keys retried)."""
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), 100):
            req = {self.table: {"Keys": keys[i:i + 100], "ConsistentRead": True}}
            for attempt in range(30):
                got = self.db.batch_get_item(RequestItems=req)
                out += got["Responses"].get(self.table, [])
                req = got.get("UnprocessedKeys") or {}
                if not req:
                    break
                time.sleep(min(1.0, 0.02 * 2 ** attempt))  # throttled: back off and ask for the rest
            else:
                raise StoreError(f"DynamoDB table {self.table!r} left keys unprocessed after 30 retries; retry later")
        return out

    def _partitions(self, index: str, value: str | None, f: Filters, descending: bool,
                    after: tuple[float, Any] | None) -> list[str]:
        if value is not None:
            return [value]
        meta = self.db.get_item(TableName=self.table, Key=_META, ConsistentRead=True).get("Item", {})
        days = sorted((int(d) for d in meta.get("days", {}).get("SS", [])), reverse=descending)
        lo = -(2**62) if f.since is None else int(f.since // 86400)
        hi = 2**62 if f.until is None else int(f.until // 86400)
        if after is not None:
            c = int(after[0] // 86400)
            lo, hi = (lo, min(hi, c)) if descending else (max(lo, c), hi)
        return [str(d) for d in days if lo <= d <= hi]

    def _scan(self, f: Filters, descending: bool, after: tuple[float, Any] | None) -> Iterator[IndexRow]:
        """Live rows matching ``f`` in (created_at, id) order after the keyset position."""
        index, value = _index_for(f)
        lo = "0" if f.since is None else _tkey(f.since)
        hi = _TOP if f.until is None else _tkey(f.until)
        if lo > hi:
            return
        for part in self._partitions(index, value, f, descending, after):
            kw: dict[str, Any] = {
                "TableName": self.table, "IndexName": index, "ScanIndexForward": not descending,
                "KeyConditionExpression": "#p = :p AND ts BETWEEN :lo AND :hi",
                "ExpressionAttributeNames": {"#p": _INDEXES[index]},
                "ExpressionAttributeValues": {":p": {"S": part}, ":lo": {"S": lo}, ":hi": {"S": hi}}}
            if after is not None and (value is not None or part == _day(after[0])):
                ts = f"{_tkey(after[0])}#{after[1]}"
                if lo <= ts <= hi:
                    kw["ExclusiveStartKey"] = {**_ep_key(after[1]), "ts": {"S": ts}, _INDEXES[index]: {"S": part}}
            yield from self._query_rows(kw, f)

    def _query_rows(self, kw: dict[str, Any], f: Filters) -> Iterator[IndexRow]:
        while True:
            got = self.db.query(**kw)
            now = time.time()
            for it in got["Items"]:
                if _live(it, now):
                    row = IndexRow(**json.loads(it["row"]["S"]))
                    if f.matches(row):
                        yield row
            if "LastEvaluatedKey" not in got:
                return
            kw["ExclusiveStartKey"] = got["LastEvaluatedKey"]

    def _index_rows(self, ids: list[str]) -> list[IndexRow]:
        now = time.time()
        return [IndexRow(**json.loads(it["row"]["S"])) for it in self._batch_get([_ep_key(eid) for eid in ids])
                if _live(it, now)]

    def _indexed(self, episode_id: str) -> bool:
        return bool(self._batch_get([_ep_key(episode_id)]))

    def index_row(self, episode_id: str) -> IndexRow:
        """The index row of one episode."""
        it = self.db.get_item(TableName=self.table, Key=_ep_key(episode_id), ConsistentRead=True).get("Item")
        if it is None or not _live(it, time.time()):
            raise EpisodeNotFound(episode_id)
        return IndexRow(**json.loads(it["row"]["S"]))

    def count(self, **filters: Any) -> int:
        """Number of matching episodes (reads the matching rows of the chosen index)."""
        return sum(1 for _ in self._scan(Filters.make(**filters), True, None))

    # --- retention -----------------------------------------------------------------------------
    def expire(self, older_than: timedelta | None = None, task_type: str | None = None,
               now: float | None = None) -> int:
        """Delete episodes created before ``now - older_than`` (or the configured TTLs).

        Items past their configured expiry (invisible to reads, but not yet removed by DynamoDB's
        TTL sweep) are deleted too, with their bodies. Returns the number of episodes deleted.
        """
        self._writable()
        now = time.time() if now is None else now
        meta = self.db.get_item(TableName=self.table, Key=_META, ConsistentRead=True).get("Item", {})
        all_types = set(meta.get("types", {}).get("SS", []))
        deleted = 0
        for ttype, ttl, exclude in expiry_rules(self.config, older_than, task_type):
            for tt in [ttype] if ttype is not None else sorted(all_types - set(exclude)):
                kw = {"TableName": self.table, "IndexName": "by_type",
                      "KeyConditionExpression": "g_type = :p AND ts < :hi",
                      "ExpressionAttributeValues": {":p": {"S": tt}, ":hi": {"S": _tkey(now - ttl.total_seconds())}}}
                deleted += self._delete(self._query_items(kw))
        return deleted

    def _query_items(self, kw: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            got = self.db.query(**kw)
            items += got["Items"]
            if "LastEvaluatedKey" not in got:
                return items
            kw["ExclusiveStartKey"] = got["LastEvaluatedKey"]

    def _delete(self, items: list[dict[str, Any]]) -> int:
        """Delete episode items with the hash items that still name them (one transaction per chunk), then bodies."""
        for i in range(0, len(items), _TXN):
            part = items[i:i + _TXN]
            for attempt in range(20):
                try:
                    self.db.transact_write_items(TransactItems=self._delete_items(part))
                    break
                except ClientError as e:
                    if not _lost_race(e):
                        raise
                    time.sleep(0.01 * (attempt + 1))  # a writer retook a content hash meanwhile: reread
            else:
                raise StoreError(f"DynamoDB table {self.table!r}: 20 deletes in a row lost to concurrent writers; retry")
            for it in part:  # bodies last: a crash in between leaves a stray blob, never a dangling item
                self.blobs.delete(json.loads(it["row"]["S"])["body_url"])
        return len(items)

    def _delete_items(self, part: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Deletes of ``part``'s episode items, and of each hash item naming one of them (a content
        stored again after its first copy expired names the new copy, and stays).
        """
        ids = {it["pk"]["S"][3:] for it in part}
        hashes = self._batch_get([_hash_key(h) for h in {it["content_hash"]["S"] for it in part}])
        out = [{"Delete": {"TableName": self.table, "Key": _ep_key(eid)}} for eid in sorted(ids)]
        out += [{"Delete": {"TableName": self.table, "Key": _hash_key(h["pk"]["S"][5:]),
                            "ConditionExpression": "episode_id = :id",
                            "ExpressionAttributeValues": {":id": h["episode_id"]}}}
                for h in hashes if h["episode_id"]["S"] in ids]
        return out

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"the DynamoDB store {self.table!r} was opened read-only; open it without read_only "
                             "to write")

    def close(self) -> None:
        """Close the client's HTTP pool, worker threads and the blob store."""
        self._pool.shutdown()
        self.db.close()
        self.blobs.close()


def _lost_race(e: Exception) -> bool:
    """Whether a transaction failed for a concurrent one (cancelled on a condition or a conflict,
    or a 5xx that retries exhausted: DynamoDB asks clients to retry those) and is worth rereading.
    """
    code = e.response.get("Error", {}).get("Code")  # type: ignore[attr-defined]
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)  # type: ignore[attr-defined]
    return code in ("TransactionCanceledException", "TransactionConflictException") or status >= 500


def _live(item: dict[str, Any], now: float) -> bool:
    """Whether an item has not passed its configured expiry."""
    exp = float(item.get("exp", {}).get("N", "0"))
    return exp == 0 or exp > now
