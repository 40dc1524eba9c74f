"""Typed branch/tree provenance (``Episode.origin``) and shared prefix turns, on every backend.

A continuation (a branch or a tree continuation) starts with its trunk's very turns; its record
keeps only its own turns, and every read splices the trunk's prefix back in front of them.
Version-1 records kept the provenance in ``metadata["branch"]`` and copied the prefix; they read
with a typed origin and their own (copied) prefix.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from storekit import make_episode

from arborl.store import StoreError, open_store
from arborl.trajectory import Episode, Origin, SchemaError, Turn, content_hash


def _turn(tid: str, parent: str | None, k: int, tag: int) -> Turn:
    return Turn(turn_id=tid, parent_id=parent, index=k, observation=f"o{tag}", prompt_ids=[tag, k],
                output_ids=[k + 1, 2], output_logprobs=[-0.5, -0.25], output_mask=[1, 1], action_text=f"a{tag}",
                action=f"a{tag}", reward=0.5 * tag, state_key=f"s{k}")


def continuation(trunk: Episode, turn: int, eid: str, n_own: int, kind: str = "tree") -> Episode:
    """An episode whose path is ``trunk``'s first ``turn`` turns (the same objects) and ``n_own`` new ones."""
    prefix = trunk.path()[:turn]
    ep = Episode(episode_id=eid, task_id=trunk.task_id, task_type=trunk.task_type, group_id=trunk.group_id,
                 seed=trunk.seed, rewards={"success": 0.0}, stop_reason="terminated", source="rl", created_at=1.0,
                 origin=Origin(of=trunk.episode_id, turn=turn, kind=kind,  # type: ignore[arg-type]
                               action="a9" if kind == "branch" else None, state_key=f"s{turn}"))
    ep.turns = list(prefix)
    parent = prefix[-1].turn_id if prefix else None
    for j in range(n_own):
        t = _turn(f"{eid}-t{j}", parent, turn + j, 10 + j + len(eid))
        ep.add_turn(t)
        parent = t.turn_id
    return ep


def _tree() -> tuple[Episode, Episode, Episode]:
    trunk = make_episode(1, n_turns=4)
    a = continuation(trunk, 2, "A", 3)  # trunk t0 t1, then 3 own turns
    b = continuation(a, 3, "B", 2)  # a continuation of a continuation: trunk t0 t1, A-t0, then 2 own
    return trunk, a, b


def test_prefix_turns_are_stored_once_and_reads_give_the_full_path(store_url):
    trunk, a, b = _tree()
    with open_store(store_url) as store:
        store.put_many([trunk, a])
        store.put_many([b])  # its trunk is already stored
        # n_nodes counts the turns a record keeps: the prefix lives in its trunk's record only
        assert [store.index_row(e).n_nodes for e in ("ep000001", "A", "B")] == [4, 3, 2]
        # the index row describes the whole path all the same
        assert store.index_row("B").n_turns == 5
        assert store.index_row("B").content_hash == content_hash(b)
        assert store.get("B") == b and store.get("A") == a  # a continuation read alone
        got = store.get_many(["B", "ep000001", "A"])
        assert got == [b, trunk, a]
        assert [t.turn_id for t in got[0].path()] == ["t0", "t1", "A-t0", "B-t0", "B-t1"]
        assert {e.episode_id for e in store.query(limit=10).items} == {"ep000001", "A", "B"}


def test_sqlite_keeps_each_prefix_turn_in_one_row(tmp_path):
    trunk, a, b = _tree()
    path = tmp_path / "t.db"
    with open_store(f"sqlite:///{path}") as store:
        store.put_many([trunk, a, b])
    db = sqlite3.connect(path)
    rows = [r[0] for r in db.execute("SELECT turn_id FROM turn_records")]
    db.close()
    assert sorted(rows) == sorted(["t0", "t1", "t2", "t3", "A-t0", "A-t1", "A-t2", "B-t0", "B-t1"])


def test_a_continuation_whose_trunk_expired_is_an_error_that_says_so(tmp_path):
    trunk, a, _ = _tree()
    trunk.created_at = 0.5
    a.created_at = 1000.0
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:
        store.put_many([trunk, a])
        assert store.expire(older_than=__import__("datetime").timedelta(seconds=100), now=600.0) == 1
        with pytest.raises(StoreError, match="continues turn t1 of episode ep000001, which is not stored"):
            store.get("A")


def _old_branch() -> Episode:
    """A branch as arborl wrote it before schema version 2: copied re-played turns, metadata provenance."""
    ep = make_episode(5, n_turns=4)
    ep.schema_version = 1
    for t in ep.turns[:2]:
        t.output_mask = [0, 0]
    ep.metadata = {"env": "FrozenLake", "replayed_turns": 2,
                   "branch": {"of": "trunk7", "turn": 2, "action": "left", "state_key": "s2"}}
    return ep


OLD_ORIGIN = Origin(of="trunk7", turn=2, kind="branch", action="left", state_key="s2")


def test_an_old_branch_record_reads_with_a_typed_origin(store_url):
    old = _old_branch()
    d = old.to_dict()
    del d["origin"]  # the version-1 layout has no such key
    assert Episode.from_dict(d).origin == OLD_ORIGIN
    assert Episode.from_json(json.dumps(d)).path() == old.path()
    with open_store(store_url) as store:
        store.put_many([old])
        got = store.get(old.episode_id)
    assert got.origin == OLD_ORIGIN and got.schema_version == 1
    assert got.turns == old.turns and got.metadata == old.metadata  # its own copied prefix, as written


def test_an_old_sqlite_meta_without_the_origin_key_reads(tmp_path):
    old = _old_branch()
    path = tmp_path / "old.db"
    with open_store(f"sqlite:///{path}") as store:
        store.put_many([old])
    db = sqlite3.connect(path)
    (meta,) = db.execute("SELECT meta FROM episodes").fetchone()
    d = json.loads(meta)
    assert d.pop("origin") is None
    old_meta = json.dumps(d, separators=(",", ":"))  # exactly the version-1 writer's meta text
    db.execute("UPDATE episodes SET meta = ?", (old_meta,))
    db.commit()
    db.close()
    with open_store(f"sqlite:///{path}") as store:
        got = store.get(old.episode_id)
    assert got.origin == OLD_ORIGIN and got.turns == old.turns


@pytest.mark.parametrize(("origin", "message"), [
    (Origin(of="", turn=1, kind="tree"), "origin.of must be the trunk's episode id"),
    (Origin(of="x", turn=-1, kind="tree"), "origin.turn must be a path index"),
    (Origin(of="x", turn=1, kind="bush"), "origin.kind 'bush' is not one of"),  # type: ignore[arg-type]
    (Origin(of="x", turn=1, kind="branch"), "a branch origin names its forced action"),
    (Origin(of="x", turn=1, kind="tree", state_key="a\x00b"), "NUL"),
    ({"of": "x"}, "origin must be an Origin or None"),
])
def test_a_malformed_origin_is_refused_by_name(sqlite_url, origin, message):
    ep = make_episode(2)
    ep.origin = origin  # type: ignore[assignment]
    with open_store(sqlite_url) as store, pytest.raises(SchemaError, match=message):
        store.put_many([ep])
