"""PostgreSQL, Redis and S3 specifics against real servers: concurrent writers, kill -9, future
schema versions, time partitioning, native TTLs, the S3 blob store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from store_services import pg_database
from storekit import kill_writer_mid_ingest, make_episode

from arborl.store import StoreConfig, StoreError, open_store
from arborl.store.blob import S3BlobStore
from arborl.trajectory import content_hash
from arborl.trajectory.schema import SCHEMA_VERSION, SchemaError

WRITER = str(Path(__file__).parent / "writer_proc.py")
pytestmark = pytest.mark.services


@pytest.fixture
def pg_url(pg_server, tmp_path):
    url, drop = pg_database(pg_server, False, tmp_path / "blobs")
    yield url
    drop()


@pytest.fixture
def pg_part_url(pg_server, tmp_path):
    url, drop = pg_database(pg_server, True, tmp_path / "blobs")
    yield url
    drop()


@pytest.fixture
def redis_store_url(redis_url_server, tmp_path):
    return f"{redis_url_server}?prefix=t{uuid.uuid4().hex[:12]}&blob=file://{tmp_path}/blobs"


def _run_writers(url: str, stride: int, count: int, batch: int, dup_every: int) -> None:
    with open_store(url):
        pass  # create the layout once
    procs = [subprocess.Popen([sys.executable, WRITER, url, str(stride * w), str(count), str(batch), str(dup_every)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=480)
        assert p.returncode == 0, err


@pytest.mark.parametrize("which", ["pg", "pg_part", "redis", pytest.param("dynamodb", marks=pytest.mark.slow)])
def test_four_concurrent_writers_lose_and_duplicate_nothing(which, request):
    url = request.getfixturevalue({"pg": "pg_url", "pg_part": "pg_part_url", "redis": "redis_store_url",
                                   "dynamodb": "ddb_url"}[which])
    # Ranges 0-299, 200-499, 400-699, 600-899 overlap; twins repeat content under new ids. moto copies
    # the whole table once per item of a transaction, so its DynamoDB gets a quarter of the work
    # (ranges 0-99, 60-159, 120-219, 180-279), or one request can outlast the client's read timeout.
    stride, count, batch, dup = (60, 100, 10, 20) if which == "dynamodb" else (200, 300, 25, 50)
    _run_writers(url, stride, count, batch, dup)
    n = 3 * stride + count
    with open_store(url) as store:
        assert store.count() == n
        rows = list(store.iter_rows())
        assert sorted(r.episode_id for r in rows) == [f"ep{i:06d}" for i in range(n)]
        assert len({r.content_hash for r in rows}) == n
        assert all(len(e.turns) == 8 for e in store.iter_episodes(batch_size=300))


def test_postgres_kill_9_during_ingest(pg_url):
    last = kill_writer_mid_ingest(pg_url, acks=4)
    time.sleep(0.5)  # the server notices the dead client and rolls its open transaction back
    with open_store(pg_url) as store:
        n = store.count()
        assert n >= last + 1 and n % 200 == 0
        with store.pool.connection() as c:
            keys = c.execute("SELECT COUNT(*) FROM arborl_keys").fetchone()[0]
            turns = c.execute("SELECT COUNT(*) FROM arborl_turns").fetchone()[0]
        assert keys == n and turns == 8 * n
        assert store.get(f"ep{last:06d}").turns[-1].turn_id == "t7"


def test_postgres_refuses_newer_schema_version(pg_url):
    with open_store(pg_url) as store:
        store.put_many([make_episode(1), make_episode(2)])
        with store.pool.connection() as c:
            c.execute("UPDATE arborl_episodes SET schema_version = %s, meta = jsonb_set(meta, '{schema_version}', %s) "
                      "WHERE episode_id = 'ep000001'", (SCHEMA_VERSION + 1, str(SCHEMA_VERSION + 1)))
        with pytest.raises(SchemaError, match=f"schema_version {SCHEMA_VERSION + 1} by a newer arborl"):
            store.get("ep000001")
        with pytest.raises(SchemaError, match="newer arborl"):
            store.slice("ep000001", 0, 1)
        assert store.get("ep000002").episode_id == "ep000002"


def test_postgres_refuses_newer_layout(pg_url):
    with open_store(pg_url) as store, store.pool.connection() as c:
        c.execute("UPDATE arborl_meta SET value = '99' WHERE key = 'layout_version'")
    with pytest.raises(StoreError, match="layout version 99"):
        open_store(pg_url)


def test_redis_refuses_newer_schema_version(redis_store_url):
    import redis

    with open_store(redis_store_url) as store:
        store.put_many([make_episode(1)])
        r = redis.Redis.from_url(redis_store_url.split("?")[0], decode_responses=True)
        key = f"{store.p}:ep:ep000001"
        row = json.loads(r.hget(key, "row"))
        row["schema_version"] = SCHEMA_VERSION + 1
        r.hset(key, "row", json.dumps(row))
        with pytest.raises(SchemaError, match=f"schema_version {SCHEMA_VERSION + 1} by a newer arborl"):
            store.get("ep000001")


def test_redis_sets_expireat_from_configured_ttl(redis_store_url):
    import redis

    now = time.time()
    cfg = StoreConfig(ttl_by_task_type={"short": timedelta(hours=1)})
    with open_store(redis_store_url, config=cfg) as store:
        store.put_many([make_episode(1, task_type="short", created_at=now), make_episode(2, task_type="keep")])
        r = redis.Redis.from_url(redis_store_url.split("?")[0], decode_responses=True)
        ttl = r.ttl(f"{store.p}:ep:ep000001")
        assert 3500 < ttl <= 3602
        assert r.ttl(f"{store.p}:hash:{content_hash(make_episode(1, task_type='short', created_at=now))}") > 3500
        assert r.ttl(f"{store.p}:ep:ep000002") == -1  # no TTL configured for "keep"


def test_redis_requires_a_blob_store(redis_url_server):
    with pytest.raises(StoreError, match="blob="):
        open_store(redis_url_server)


def _partitions(store) -> list[str]:
    with store.pool.connection() as c:
        return sorted(r[0] for r in c.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'arborl_episodes'::regclass"))


def test_partitioned_postgres_creates_prunes_and_drops_partitions(pg_part_url):
    jan, feb, mar = 1_704_067_200.0, 1_706_745_600.0, 1_709_251_200.0  # 2024-01-01, 02-01, 03-01 UTC
    eps = [make_episode(0, created_at=jan + 10), make_episode(1, created_at=jan + 20),
           make_episode(2, created_at=feb + 10), make_episode(3, created_at=mar + 10)]
    with open_store(pg_part_url) as store:
        store.put_many(eps)
        assert _partitions(store) == ["arborl_episodes_pm202401", "arborl_episodes_pm202402",
                                      "arborl_episodes_pm202403"]
        with store.pool.connection() as c:
            plan = "\n".join(r[0] for r in c.execute(
                "EXPLAIN SELECT * FROM arborl_episodes WHERE created_at >= %s AND created_at < %s", (feb, mar)))
        assert "pm202402" in plan and "pm202401" not in plan and "pm202403" not in plan
        assert [e.episode_id for e in store.query(since=feb).episodes] == ["ep000003", "ep000002"]
        # cutoff mid-February: January is dropped as a whole partition, ep2 (Feb 1) deleted row-wise
        cutoff = feb + 86400 * 14
        assert store.expire(older_than=timedelta(days=1), now=cutoff + 86400) == 3
        assert _partitions(store) == ["arborl_episodes_pm202402", "arborl_episodes_pm202403"]
        assert [e.episode_id for e in store.iter_episodes()] == ["ep000003"]
        assert store.put_many([make_episode(0, created_at=jan + 10)]) == ["ep000000"]  # key freed, partition back


def test_partitioning_cannot_change_after_creation(pg_url):
    with open_store(pg_url):
        pass
    with pytest.raises(StoreError, match="created with partitioned=None"):
        open_store(pg_url + "&partitioned=day")


def test_s3_blob_store_against_moto(s3_endpoint, aws_env):
    blobs = S3BlobStore("b" + uuid.uuid4().hex[:12], "media", endpoint_url=s3_endpoint)
    url = blobs.put(b"hello")
    assert url.startswith(f"s3://{blobs.bucket}/media/sha256/") and blobs.put(b"hello") == url
    assert blobs.get(url) == b"hello"
    blobs.delete(url)
    with pytest.raises(StoreError, match="missing"):
        blobs.get(url)
    with pytest.raises(StoreError, match="not in bucket"):
        blobs.get("s3://other-bucket/x")
    blobs.close()


def test_postgres_media_needs_a_blob_store(pg_server):
    url, drop = pg_database(pg_server, False, Path("/nonexistent"))
    try:
        with open_store(url.split("?")[0]) as store, pytest.raises(StoreError, match=r"\?blob="):
            store.put_media(b"x", "image/png")
    finally:
        drop()
