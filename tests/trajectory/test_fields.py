"""Every field of a turn reaches the content hash and the Parquet export (docs/trajectory.md, "Adding
a field"): each Turn field (and each field of a MediaRef or ToolCall inside one) is changed in
turn, and the hash and the export row must change with it. A field added to Turn without teaching
the canonical encoder and the export about it fails here (or at their import, which checks the
field lists)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from arborl.store.export import TURN_COLUMNS, episode_rows
from arborl.trajectory import TURN_FIELDS, Episode, MediaRef, ToolCall, Turn, content_hash

NOT_HASHED = {"timings": "timings vary run to run", "turn_id": "ids are replaced by creation order"}
"""Turn fields whose change must leave the content hash as it is (and why)."""


def _episode() -> Episode:
    """Two turns, the second with every field set to a value other than its default."""
    ep = Episode(episode_id="e", task_id="t", task_type="x", stop_reason="terminated", created_at=1.0)
    ep.add_turn(Turn(turn_id="root"))
    ep.add_turn(Turn(
        turn_id="t1", parent_id="root", index=1, observation="obs", media=[MediaRef(url="file:///a.png", mime="image/png",
                                                                                  sha256="ab")],
        prompt_ids=[1, 2], output_ids=[3], output_logprobs=[-0.5], output_mask=[1], action_text="go", action="a",
        tool_call=ToolCall(name="f", arguments={"q": 1}, call_id="c1"), valid=True, result="r", state_key="s",
        reward=0.5, terminated=True, truncated=False, error="e", timings={"env": 0.1}, policy_version=3,
        info={"k": "v"}))
    return ep


def _changed(value: Any) -> list[tuple[str, Any]]:
    """Values other than ``value``, of its type: (label, value); a dataclass once per field of it."""
    if dataclasses.is_dataclass(value):
        return [(f.name, dataclasses.replace(value, **{f.name: v}))
                for f in dataclasses.fields(value) for _, v in _changed(getattr(value, f.name))[:1]]
    t = type(value)
    if t is bool:
        return [("flipped", not value)]
    if t is int:
        return [("+1", value + 1)]
    if t is float:
        return [("+0.25", value + 0.25)]
    if t is str:
        return [("+x", value + "x")]
    if t is dict:
        return [("new key", {**value, "new": 1})]
    if t is list and value and dataclasses.is_dataclass(value[0]):
        return [(label, [v, *value[1:]]) for label, v in _changed(value[0])]
    if t is list:
        return [("appended", [*value, value[-1]])]
    raise AssertionError(f"teach this test a changed value for {t.__name__}, the type of a new Turn field")


def _variants() -> list[tuple[str, Episode]]:
    out = []
    for name in TURN_FIELDS:
        base = _episode().turns[1]
        values = [("None", None)] if name == "parent_id" else _changed(getattr(base, name))
        for label, v in values:
            ep = _episode()
            setattr(ep.turns[1], name, v)
            out.append((f"{name} ({label})", ep))
    return out


def _row(ep: Episode) -> dict[str, Any]:
    return episode_rows(ep)[1]


@pytest.mark.parametrize(("name", "ep"), _variants(), ids=[v[0] for v in _variants()])
def test_every_turn_field_changes_the_hash_and_the_export(name, ep):
    field = name.split(" ")[0]
    base = _episode()
    hashed = content_hash(ep) != content_hash(base)
    assert hashed is (field not in NOT_HASHED), f"{name}: the content hash {'ignores' if not hashed else 'covers'} it"
    columns = TURN_COLUMNS[field]
    before, after = _row(base), _row(ep)
    assert [c for c in columns if before[c] != after[c]], f"{name}: none of the export columns {columns} changed"


def test_export_columns_are_the_rows_keys_and_cover_every_field():
    row = _row(_episode())
    assert set(TURN_FIELDS) == set(TURN_COLUMNS)
    assert {c for cols in TURN_COLUMNS.values() for c in cols} <= set(row)
    assert json.loads(row["media"]) == [{"url": "file:///a.png", "mime": "image/png", "sha256": "ab"}]
    assert row["tool_call_id"] == "c1" and row["seed"] is None and json.loads(row["metadata"]) == {}


def test_export_to_parquet_keeps_every_field(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    from arborl.store import open_store

    ep = _episode()
    with open_store(f"sqlite:///{tmp_path}/t.db") as store:
        store.put_many([ep])
        store.export_parquet(str(tmp_path / "t.parquet"))
    got = pq.read_table(tmp_path / "t.parquet").to_pylist()[1]
    want = _row(ep)
    for field, columns in TURN_COLUMNS.items():
        for c in columns:
            assert got[c] == want[c], (field, c)
