"""DynamoDB specifics against moto's DynamoDB server: the index each filter reads (checked against
SQLite on the same episodes), expiry by item attribute and native TTL, foreign and missing
tables, read-only, newer layouts and records, and credentials kept out of every message and log
line. Concurrent writers: test_services.py."""

from __future__ import annotations

import logging
import random
import time
import uuid
from datetime import timedelta

import boto3
import pytest
from storekit import make_episode

from arborl.store import EpisodeNotFound, StoreConfig, StoreError, open_store
from arborl.store.dynamodb import LAYOUT_VERSION
from arborl.trajectory.schema import SCHEMA_VERSION, SchemaError

pytestmark = pytest.mark.services
DAY = 86400.0


def _client(url: str):
    endpoint = url.split("endpoint=")[1].split("&")[0]
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")


def _table(url: str) -> str:
    return url.split("://")[1].split("?")[0]


def test_every_index_gives_what_sqlite_gives_across_days_and_pages(ddb_url, tmp_path):
    rng = random.Random(7)
    eps = [make_episode(i, task_type=rng.choice("ab"), reward=rng.choice([0.0, 0.25, 1.0]),
                        source=rng.choice(["rl", "eval"]), iteration=rng.randrange(3), policy_version=rng.randrange(3),
                        created_at=1_700_000_000.0 + (i // 4) * DAY / 3 + (i % 2), tags=["x"] if i % 3 else [])
           for i in range(40)]  # 14 days, ties in created_at, every GSI partition populated
    queries = [{}, {"task_type": "a"}, {"policy_version": 1}, {"source": "rl", "iteration": 2},
               {"source": "eval"}, {"policy_version": 2, "task_type": "b", "min_reward": 1.0},
               {"since": 1_700_000_000.0 + 3 * DAY, "until": 1_700_000_000.0 + 9 * DAY},
               {"task_type": "b", "since": 1_700_000_000.0 + 5 * DAY}, {"tags": ["x"], "iteration": 1},
               {"since": 1_700_000_000.0 + 9 * DAY, "until": 1_700_000_000.0 + 3 * DAY}]
    with open_store(ddb_url) as ddb, open_store(f"sqlite:///{tmp_path}/ref.db") as ref:
        assert ddb.put_many(eps) == ref.put_many(eps)
        for q in queries:
            want = [r.episode_id for r in ref.iter_rows(**q)]
            assert [r.episode_id for r in ddb.iter_rows(batch_size=6, **q)] == want, q
            assert ddb.count(**q) == len(want), q
            pages, cursor = [], None
            while True:
                rows, cursor = ddb.query_index(limit=7, cursor=cursor, **q)
                pages += [r.episode_id for r in rows]
                if cursor is None:
                    break
            assert pages == want[::-1], q
        assert [p.to_dict() for p in ddb.profile(("source", "iteration"))] == \
            [p.to_dict() for p in ref.profile(("source", "iteration"))]


def test_configured_ttl_hides_expired_items_at_once_and_sets_the_native_ttl(ddb_url):
    now = time.time()
    cfg = StoreConfig(ttl_by_task_type={"short": timedelta(days=3)})
    old = make_episode(1, task_type="short", created_at=now - 10 * DAY)
    with open_store(ddb_url, config=cfg) as store:
        store.put_many([old, make_episode(2, task_type="keep", created_at=now - 10 * DAY)])
        assert [r.episode_id for r in store.iter_rows()] == ["ep000002"] and store.count(task_type="short") == 0
        with pytest.raises(EpisodeNotFound):
            store.get("ep000001")
        twin = make_episode(1, task_type="short", created_at=now - 10 * DAY)
        twin.episode_id = "again"
        assert store.put_many([twin]) == ["again"]  # the expired copy's content hash does not dedup
        client, table = _client(ddb_url), _table(ddb_url)
        ttl = client.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "ttl")
        item = client.get_item(TableName=table, Key={"pk": {"S": "ep#again"}, "sk": {"S": "row"}})["Item"]
        exp = int(old.created_at + 3 * DAY) + 1
        assert (int(item["exp"]["N"]), int(item["ttl"]["N"])) == (exp, exp + 86400)
        kept = client.get_item(TableName=table, Key={"pk": {"S": "ep#ep000002"}, "sk": {"S": "row"}})["Item"]
        assert "ttl" not in kept and kept["exp"]["N"] == "0"
        assert store.expire(now=now) == 2  # both expired copies, with their bodies
        assert client.scan(TableName=table, Select="COUNT")["Count"] == 3  # meta, ep000002 and its hash


def test_foreign_and_missing_tables_are_refused_and_left_untouched(ddb_url):
    client, table = _client(ddb_url), _table(ddb_url)
    boto3.client("s3", endpoint_url=client.meta.endpoint_url).create_bucket(Bucket=table)  # the body bucket is there
    with pytest.raises(StoreError, match=f"no DynamoDB table '{table}'"):
        open_store(ddb_url, read_only=True)
    assert table not in client.list_tables()["TableNames"]
    client.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    client.put_item(TableName=table, Item={"id": {"S": "theirs"}})
    with pytest.raises(StoreError, match="is not an arborl store"):
        open_store(ddb_url)
    assert client.scan(TableName=table)["Items"] == [{"id": {"S": "theirs"}}]
    client.delete_table(TableName=table)  # arborl's keys, but items and no layout record: not ours either
    with open_store(ddb_url):
        pass
    client.delete_item(TableName=table, Key={"pk": {"S": "meta"}, "sk": {"S": "meta"}})
    client.put_item(TableName=table, Item={"pk": {"S": "x"}, "sk": {"S": "y"}})
    with pytest.raises(StoreError, match="is not an arborl store"):
        open_store(ddb_url)
    assert client.scan(TableName=table)["Items"] == [{"pk": {"S": "x"}, "sk": {"S": "y"}}]


def test_read_only_reads_and_refuses_writes(ddb_url):
    with open_store(ddb_url) as store:
        store.put_many([make_episode(1)])
    with open_store(ddb_url, read_only=True) as store:
        assert store.get("ep000001") == make_episode(1)
        for write in (lambda: store.put_many([make_episode(2)]), lambda: store.expire(older_than=timedelta(0))):
            with pytest.raises(StoreError, match="opened read-only"):
                write()
        assert store.count() == 1


def test_newer_layout_and_newer_record_are_refused(ddb_url):
    with open_store(ddb_url) as store:
        store.put_many([make_episode(1)])
    client, table = _client(ddb_url), _table(ddb_url)
    key = {"pk": {"S": "ep#ep000001"}, "sk": {"S": "row"}}
    row = client.get_item(TableName=table, Key=key)["Item"]["row"]["S"]
    client.update_item(TableName=table, Key=key, UpdateExpression="SET #r = :r", ExpressionAttributeNames={"#r": "row"},
                       ExpressionAttributeValues={":r": {"S": row.replace(f'"schema_version": {SCHEMA_VERSION}',
                                                                          f'"schema_version": {SCHEMA_VERSION + 1}')}})
    with open_store(ddb_url) as store, pytest.raises(SchemaError, match="newer arborl"):
        store.get("ep000001")
    client.update_item(TableName=table, Key={"pk": {"S": "meta"}, "sk": {"S": "meta"}},
                       UpdateExpression="SET layout_version = :v",
                       ExpressionAttributeValues={":v": {"N": str(LAYOUT_VERSION + 1)}})
    with pytest.raises(StoreError, match="written by a newer arborl"):
        open_store(ddb_url)


def test_bad_urls_are_one_line_errors_with_the_fix(ddb_url):
    for bad, match in ((ddb_url.replace("region=", "bogus=1&region="), "unknown parameter"),
                       (ddb_url.split("?")[0], "keeps bodies in a blob store"),
                       ("dynamodb://AKIAKEY:hunter2@table?region=us-east-1&blob=file:///tmp/x", "one table name"),
                       ("dynamodb:///x", "one table name")):
        with pytest.raises(StoreError, match=match) as e:
            open_store(bad)
        assert "\n" not in str(e.value) and "hunter2" not in str(e.value)


def test_credentials_appear_in_no_error_and_no_log_line(ddb_url, monkeypatch, caplog):
    secret = "Zx9-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with caplog.at_level(logging.DEBUG):  # botocore logs requests, headers and signing at DEBUG
        with open_store(ddb_url) as store:
            store.put_many([make_episode(1)])
            assert store.get("ep000001") == make_episode(1)
        t = time.perf_counter()
        unreachable = ddb_url.replace(ddb_url.split("endpoint=")[1].split("&")[0], "http://127.0.0.1:1")
        with pytest.raises(StoreError, match="cannot open the DynamoDB store dynamodb://") as e:
            open_store(unreachable.split("&blob=")[0] + "&blob=file:///nonexistent")
        assert time.perf_counter() - t < 15 and "\n" not in str(e.value)
    assert any("botocore" in r.name for r in caplog.records)  # the logs were really captured
    assert secret not in str(e.value) and secret not in caplog.text
