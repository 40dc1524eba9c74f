"""The store contract, run against every backend: SQLite, PostgreSQL (plain and time-partitioned),
Redis with file blobs, Redis with S3 (moto) blobs and DynamoDB (moto). Expectations are computed by hand."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from storekit import make_episode, with_param

from arborl.store import EpisodeNotFound, StoreConfig, open_store
from arborl.trajectory import content_hash
from arborl.trajectory.schema import SCHEMA_VERSION, SchemaError


def test_put_get_round_trip_is_lossless(store_url):
    eps = [make_episode(i, branch=(i % 2 == 0)) for i in range(6)]
    eps[0].turns[1].timings = {"generate": 0.5}
    eps[0].metadata = {"model": "tiny", "nested": {"a": [1, 2]}}
    with open_store(store_url) as store:
        ids = store.put_many(eps)
        assert ids == [e.episode_id for e in eps]
        for e in eps:
            assert store.get(e.episode_id) == e
        assert store.get_many([eps[3].episode_id, eps[1].episode_id]) == [eps[3], eps[1]]
        with pytest.raises(EpisodeNotFound):
            store.get("nope")
        with pytest.raises(EpisodeNotFound):
            store.index_row("nope")
        with pytest.raises(EpisodeNotFound):
            store.slice("nope", 0, 1)


def test_duplicate_content_is_stored_once_and_returns_existing_id(store_url):
    a = make_episode(1)
    b = make_episode(1)
    b.episode_id, b.created_at, b.group_id, b.tags = "other", 5.0, "gX", ["x"]  # not part of the content hash
    assert content_hash(a) == content_hash(b)
    with open_store(store_url) as store:
        assert store.put_many([a]) == [a.episode_id]
        assert store.put_many([b, make_episode(2)]) == [a.episode_id, "ep000002"]
        assert store.put_many([make_episode(3), make_episode(3)]) == ["ep000003", "ep000003"]
        assert store.count() == 3
        with pytest.raises(EpisodeNotFound):
            store.get("other")


def test_same_id_with_other_content_is_refused_and_nothing_stored(store_url):
    with open_store(store_url) as store:
        store.put_many([make_episode(1)])
        clash = make_episode(2)
        clash.episode_id = "ep000001"
        with pytest.raises(SchemaError, match="ep000001 is already stored with different content"):
            store.put_many([make_episode(5), clash])
        assert store.count() == 1


def test_query_filters_and_newest_first(store_url):
    eps = [
        make_episode(0, task_type="search", reward=0.0, success=0.0, source="synth", iteration=-1, tags=["a"]),
        make_episode(1, task_type="search", reward=1.0, policy_version=1, iteration=1, tags=["a", "b"]),
        make_episode(2, task_type="code", reward=2.0, policy_version=1, iteration=2),
        make_episode(3, task_type="search", reward=0.5, policy_version=2, iteration=3, success=None, tags=["b"]),
    ]
    with open_store(store_url) as store:
        store.put_many(eps)

        def q(**kw):
            return [e.episode_id for e in store.query(**kw).episodes]

        assert q(task_type="search") == ["ep000003", "ep000001", "ep000000"]
        # reward = sum of 4 step rewards along the path
        assert q(min_reward=2.0) == ["ep000003", "ep000002", "ep000001"]
        assert q(min_reward=2.0, max_reward=4.0) == ["ep000003", "ep000001"]
        assert q(policy_version=1) == ["ep000002", "ep000001"]
        assert q(tags=["a"]) == ["ep000001", "ep000000"]
        assert q(tags=["a", "b"]) == ["ep000001"]
        assert q(source="synth") == ["ep000000"]
        assert q(min_iteration=1, max_iteration=2) == ["ep000002", "ep000001"]
        assert q(iteration=3) == ["ep000003"]
        assert q(success=False) == ["ep000000"]
        assert q(since=1_700_000_001.0, until=1_700_000_003.0) == ["ep000002", "ep000001"]
        since = datetime.fromtimestamp(1_700_000_002, tz=UTC)
        assert q(since=since) == ["ep000003", "ep000002"]
        assert q(since=since.replace(tzinfo=None)) == ["ep000003", "ep000002"]  # naive = UTC
        assert store.count(task_type="search", min_reward=2.0) == 2
        assert q(order="oldest", task_type="search") == ["ep000000", "ep000001", "ep000003"]
        with pytest.raises(ValueError, match="order must be 'newest' or 'oldest'"):
            store.query(order="sideways")
        with pytest.raises(TypeError, match="unknown store filter"):
            store.query(task=1)


def test_stop_reason_filter_pages_both_orders(store_url):
    eps = [make_episode(i, created_at=100.0 + i // 3) for i in range(9)]  # ties within each third
    for e in eps[1::3]:
        e.stop_reason = "env_error"
    with open_store(store_url) as store:
        store.put_many(eps)
        assert store.count(stop_reason="env_error") == 3
        for order, expect in (("oldest", ["ep000000", "ep000002", "ep000003", "ep000005", "ep000006", "ep000008"]),
                              ("newest", ["ep000008", "ep000006", "ep000005", "ep000003", "ep000002", "ep000000"])):
            seen, cursor = [], None
            while True:
                rows, cursor = store.query_index(limit=4, cursor=cursor, order=order, stop_reason="terminated")
                seen += [r.episode_id for r in rows]
                if cursor is None:
                    break
            assert seen == expect
        assert [r.episode_id for r in store.iter_rows(stop_reason="env_error")] == ["ep000001", "ep000004", "ep000007"]


def test_pagination_covers_everything_once_with_equal_timestamps(store_url):
    eps = [make_episode(i, created_at=100.0 + i // 3) for i in range(10)]  # ties within each third
    with open_store(store_url) as store:
        store.put_many(eps)
        seen, cursor = [], None
        while True:
            page = store.query(limit=4, cursor=cursor)
            seen += [e.episode_id for e in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        # newest first; ties by insertion order, newest insertion first
        assert seen == [f"ep{i:06d}" for i in range(9, -1, -1)]
        assert [e.episode_id for e in store.iter_episodes(batch_size=3)] == [f"ep{i:06d}" for i in range(10)]
        with pytest.raises(ValueError, match="invalid cursor"):
            store.query(cursor="garbage")


def test_slice_follows_the_main_path_only(store_url):
    ep = make_episode(0, n_turns=8, branch=True)  # "side" hangs off t0 and is not on the main path
    with open_store(store_url) as store:
        store.put_many([ep])
        turns = store.slice(ep.episode_id, 3, 6)
        assert [t.turn_id for t in turns] == ["t3", "t4", "t5"]
        assert turns == ep.path()[3:6]
        assert [t.turn_id for t in store.slice(ep.episode_id, 6)] == ["t6", "t7"]
        assert store.slice(ep.episode_id, 9, 12) == []
        row = store.index_row(ep.episode_id)
        assert (row.n_turns, row.n_nodes, row.reward) == (8, 9, 2.0)  # side turn's reward 100 not counted


def test_profile_groups(store_url):
    eps = [
        make_episode(0, task_type="a", reward=1.0, success=1.0),
        make_episode(1, task_type="a", reward=0.0, success=0.0, n_turns=2),
        make_episode(2, task_type="a", reward=0.5, success=None, n_turns=6),
        make_episode(3, task_type="b", reward=0.0, success=0.0, policy_version=1),
    ]
    with open_store(store_url) as store:
        store.put_many(eps)
        prof = {(p.group["task_type"], p.group["policy_version"]): p for p in store.profile()}
        a = prof[("a", 0)]
        assert (a.count, a.n_scored, a.success_rate) == (3, 2, 0.5)
        assert a.mean_reward == pytest.approx((4.0 + 0.0 + 3.0) / 3)
        assert a.mean_turns == pytest.approx(4.0)
        assert prof[("b", 1)].success_rate == 0.0
        (total,) = store.profile(group_by=())
        assert total.count == 4
        with pytest.raises(ValueError, match="cannot group by"):
            store.profile(group_by=("reward",))


def test_expire_by_age_and_by_configured_ttl(store_url):
    now = time.time()  # real time: the Redis index also expires keys natively by EXPIREAT
    day = 86400.0
    eps = [
        make_episode(0, task_type="a", created_at=now - 10 * day),
        make_episode(1, task_type="a", created_at=now - 2 * day),
        make_episode(2, task_type="b", created_at=now - 10 * day),
        make_episode(3, task_type="b", created_at=now - 4 * day),
        make_episode(4, task_type="c", created_at=now - 40 * day, tags=["t"]),
    ]
    cfg = StoreConfig(ttl_by_task_type={"b": timedelta(days=3)}, default_ttl=timedelta(days=30))
    with open_store(store_url, config=cfg) as store:
        store.put_many(eps)
        assert store.expire(older_than=timedelta(days=5), task_type="a", now=now) == 1
        assert store.expire(now=now) == 3  # b older than 3 days (2), c older than 30 days (1)
        assert [e.episode_id for e in store.iter_episodes()] == ["ep000001"]
        assert store.count() == 1
        assert store.slice("ep000001", 0, 1)[0].turn_id == "t0"
        assert store.put_many([make_episode(2, task_type="b", created_at=now)]) == ["ep000002"]  # hash freed


def test_ttl_from_url(store_url):
    with open_store(with_param(store_url, "ttl=b:3d,*:30d")) as store:
        assert store.config.ttl_for("b") == timedelta(days=3)
        assert store.config.ttl_for("zzz") == timedelta(days=30)


def test_reopen_sees_committed_data(store_url):
    with open_store(store_url) as s:
        s.put_many([make_episode(1)])
    with open_store(store_url) as s:
        assert s.count() == 1 and s.get("ep000001") == make_episode(1)


def test_empty_put_and_empty_store(store_url):
    with open_store(store_url) as store:
        assert store.put_many([]) == []
        page = store.query()
        assert page.episodes == [] and page.next_cursor is None
        assert list(store.iter_episodes()) == [] and store.count() == 0 and store.profile() == []


def test_media_by_reference(store_url):
    with open_store(store_url) as store:
        ref = store.put_media(b"\x89PNG fake", "image/png")
        assert ref.url.startswith(("file://", "s3://")) and ref.mime == "image/png"
        assert store.put_media(b"\x89PNG fake", "image/png").url == ref.url  # content addressed
        ep = make_episode(1)
        ep.turns[0].media = [ref]
        store.put_many([ep])
        got = store.get(ep.episode_id).turns[0].media[0]
        assert got == ref and store.get_media(got) == b"\x89PNG fake"


def test_schema_version_constant_is_what_we_write(store_url):
    with open_store(store_url) as store:
        store.put_many([make_episode(1)])
        assert store.query_index()[0][0].schema_version == SCHEMA_VERSION
