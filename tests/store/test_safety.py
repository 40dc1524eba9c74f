"""Bad input (every backend), future schema versions, crash safety and concurrent writers (SQLite)."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from storekit import kill_writer_mid_ingest, make_episode

from arborl.store import StoreError, open_store
from arborl.trajectory.schema import SCHEMA_VERSION, SchemaError

WRITER = str(Path(__file__).parent / "writer_proc.py")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
        (lambda d: d.pop("schema_version"), "schema_version"),
        (lambda d: d["turns"][1].pop("turn_id"), "turn_id"),
        (lambda d: d.update(rewards={"success": math.inf}), "rewards['success']"),
        (lambda d: d["turns"][2].update(reward=math.nan), "reward"),
        (lambda d: d["turns"][0].update(output_logprobs=[-0.1]), "output_logprobs"),
        (lambda d: d.update(bogus=1), "bogus"),
        (lambda d: d.update(policy_version="v1"), "policy_version"),
        (lambda d: d.update(created_at=math.nan), "created_at"),
        (lambda d: d.update(tags="a"), "tags"),
        (lambda d: d["turns"][0].update(info={"x": math.inf}), "info['x'] = inf is not finite"),
    ],
)
def test_malformed_episode_is_rejected_naming_the_field_and_nothing_is_stored(store_url, mutate, field):
    bad = make_episode(99).to_dict()
    mutate(bad)
    with open_store(store_url) as store:
        with pytest.raises(SchemaError) as err:
            store.put_many([make_episode(1), bad, make_episode(2)])
        assert field in str(err.value)
        assert store.count() == 0


def test_non_episode_is_rejected(sqlite_url):
    with open_store(sqlite_url) as store, pytest.raises(SchemaError, match="Episode objects or episode dicts"):
        store.put_many([make_episode(1), "not an episode"])


def test_newer_schema_version_is_refused_with_a_clear_message(sqlite_url, tmp_path):
    with open_store(sqlite_url) as store:
        store.put_many([make_episode(1), make_episode(2)])
    # a future arborl wrote this row: bump the version in both the index row and the meta JSON
    db = sqlite3.connect(tmp_path / "traj.db")
    meta = json.loads(db.execute("SELECT meta FROM episodes WHERE episode_id='ep000001'").fetchone()[0])
    meta["schema_version"] = SCHEMA_VERSION + 1
    db.execute("UPDATE episodes SET schema_version=?, meta=? WHERE episode_id='ep000001'",
               (SCHEMA_VERSION + 1, json.dumps(meta)))
    db.commit()
    db.close()
    with open_store(sqlite_url) as store:
        msg = f"schema_version {SCHEMA_VERSION + 1} by a newer arborl"
        with pytest.raises(SchemaError, match=msg):
            store.get("ep000001")
        with pytest.raises(SchemaError, match=msg):
            store.slice("ep000001", 0, 2)
        with pytest.raises(SchemaError, match=msg):
            list(store.iter_episodes())
        assert store.get("ep000002").episode_id == "ep000002"  # other rows still read


def test_newer_store_layout_is_refused(sqlite_url, tmp_path):
    with open_store(sqlite_url):
        pass
    db = sqlite3.connect(tmp_path / "traj.db")
    db.execute("UPDATE store_meta SET value='99' WHERE key='layout_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="layout version 99, written by a newer arborl"):
        open_store(sqlite_url)


def test_kill_9_during_bulk_ingest_leaves_a_clean_store(tmp_path):
    url = f"sqlite:///{tmp_path}/traj.db"
    last = kill_writer_mid_ingest(url, acks=5)
    with open_store(url) as store:
        assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n = store.count()
        assert n >= last + 1  # every acknowledged put_many is there
        assert n % 200 == 0  # whole batches only: no partial put_many
        turns = store._db.execute("SELECT COUNT(*) FROM turn_records").fetchone()[0]
        assert turns == 8 * n  # no episode without its turns, no orphan turns
        assert store.get(f"ep{last:06d}").turns[-1].turn_id == "t7"


def test_four_concurrent_writers_with_overlapping_duplicates(tmp_path):
    url = f"sqlite:///{tmp_path}/traj.db"
    with open_store(url):
        pass  # create the layout once so writers race only on data
    # writers cover overlapping id ranges: 0-299, 200-499, 400-699, 600-899 (same ids = same content)
    procs = [subprocess.Popen([sys.executable, WRITER, url, str(200 * w), "300", "25", "50"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with open_store(url) as store:
        assert store.count() == 900  # twins (same content as ep k*50) were deduplicated
        ids = {r.episode_id for r in store.iter_rows()}
        assert ids == {f"ep{i:06d}" for i in range(900)}
        hashes = store._db.execute("SELECT COUNT(DISTINCT content_hash) FROM episodes").fetchone()[0]
        assert hashes == 900
        assert store._db.execute("SELECT COUNT(*) FROM turn_records").fetchone()[0] == 900 * 8
