"""Turn rows of the SQLite store: how they are written, and read back by rowid range.

Every turn is one row whose integer key is ``(episode seq << TURN_BITS) | creation order``, so
the turns of an episode are adjacent in the table b-tree and reading some or all of them is a
rowid range scan (no second index).

**Layout 2, table ``turn_records``** (written by this arborl). Columns: ``path_index`` (position
on the main path, NULL off it), ``turn_id``, ``parent_id``, ``reward`` (the step reward),
``timings`` (JSON) and ``record``: the turn's frames of the canonical form
(:attr:`~arborl.trajectory.canonical.CanonicalTurn.record`): its JSON without the token arrays,
then the four arrays packed little-endian (int32 ids, float64 log-probs, 0/1 mask bytes) where
that is exact, or as JSON text where it is not (bools, ints among the log-probs, ids of 2**31 or
more). These are the bytes :meth:`~arborl.trajectory.schema.Episode.content_hash` covers, stored
as they are: ingest builds them once for both. Seven columns take about a third less SQLite
time to insert than the eleven of layout 1 (~17 us per 8-turn episode), and a read unpacks the
arrays from bytes instead of parsing them from JSON.

**Layout 1, table ``turns``** (written by arborl before layout 2): the same key and first five
columns, then ``body`` (the turn's canonical JSON without the arrays that are packed) and one
column per array (packed bytes, or NULL when the array is in ``body``). Stores written with it
keep these rows and are read here; they are never written again. Opening such a store adds the
``turn_records`` table for new episodes, so the turns of one episode are in exactly one of the
two tables, and reads look in both.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from arborl.store.base import StoreError
from arborl.store.codec import TurnCols, turn_dict
from arborl.trajectory.canonical import split_record, unpack_array

TURN_BITS = 20
"""Turn row id = (episode seq << TURN_BITS) | turn creation order: up to 2**20 turns per episode."""

RECORDS_TABLE = """CREATE TABLE IF NOT EXISTS turn_records(
  id INTEGER PRIMARY KEY, path_index INTEGER, turn_id TEXT NOT NULL, parent_id TEXT,
  reward REAL NOT NULL, timings TEXT NOT NULL, record BLOB NOT NULL)"""
INSERT_RECORD = "INSERT INTO turn_records VALUES (?,?,?,?,?,?,?)"

_RECORD_COLS = "turn_id, parent_id, timings, record"
_LEGACY_COLS = "turn_id, parent_id, timings, body, prompt_ids, output_ids, output_logprobs, output_mask"
_LEGACY_ARRAYS = (("prompt_ids", "i"), ("output_ids", "i"), ("output_logprobs", "d"), ("output_mask", "b"))
_OF_EPISODE = "SELECT {cols} FROM {table} WHERE id >= ? AND id < ? ORDER BY id"
_OF_PATH = ("SELECT {cols} FROM {table} WHERE id >= ? AND id < ? AND path_index >= ? AND path_index < ? "
            "ORDER BY path_index")


def key_range(seq: int) -> tuple[int, int]:
    """Row ids ``[lo, hi)`` of the turns of episode ``seq``."""
    return seq << TURN_BITS, (seq + 1) << TURN_BITS


def record_rows(seq: int, turns: list[TurnCols], episode_id: str = "") -> list[tuple[Any, ...]]:
    """The ``turn_records`` rows of episode ``seq`` (its turns in creation order)."""
    if len(turns) >= 1 << TURN_BITS:
        raise StoreError(f"episode {episode_id} has {len(turns)} turns; the SQLite store holds at most "
                         f"{(1 << TURN_BITS) - 1} per episode")
    base = seq << TURN_BITS
    return [(base | i, *t) for i, t in enumerate(turns)]


def read_turns(db: sqlite3.Connection, seqs: list[int], legacy: bool) -> dict[int, list[dict[str, Any]]]:
    """All turns of the episodes ``seqs``, in creation order and ``to_dict`` form, by seq."""
    out: dict[int, list[dict[str, Any]]] = {}
    sql = _OF_EPISODE.format(cols=_RECORD_COLS, table="turn_records")
    for k in seqs:
        rows = db.execute(sql, key_range(k)).fetchall()
        if rows:
            out[k] = _from_records(rows)
    if legacy:
        sql = _OF_EPISODE.format(cols=_LEGACY_COLS, table="turns")
        for k in seqs:
            rows = db.execute(sql, key_range(k)).fetchall()
            if rows:
                out[k] = _from_legacy(rows)
    return out


def read_path(db: sqlite3.Connection, seq: int, start: int, stop: int | None, legacy: bool) -> list[dict[str, Any]]:
    """Turns ``start..stop-1`` of the main path of episode ``seq``, reading only those rows."""
    args = (*key_range(seq), start, 2**62 if stop is None else stop)
    rows = db.execute(_OF_PATH.format(cols=_RECORD_COLS, table="turn_records"), args).fetchall()
    if rows or not legacy:
        return _from_records(rows)
    return _from_legacy(db.execute(_OF_PATH.format(cols=_LEGACY_COLS, table="turns"), args).fetchall())


def delete_turns(db: sqlite3.Connection, seqs: list[int], legacy: bool) -> None:
    """Delete every turn row of the episodes ``seqs``."""
    for table in ("turn_records", "turns") if legacy else ("turn_records",):
        db.executemany(f"DELETE FROM {table} WHERE id >= ? AND id < ?", [key_range(k) for k in seqs])


def _from_records(rows: list[tuple[str, str | None, str, bytes]]) -> list[dict[str, Any]]:
    try:
        parts = [split_record(r[3]) for r in rows]
    except ValueError as e:
        raise StoreError(f"a stored turn record does not parse ({e}); the database file is damaged") from e
    # one JSON parse for all the turns: per-call overhead dominates small turns
    bodies = json.loads(b"[" + b",".join([p[0] for p in parts]) + b"]") if rows else []
    out = []
    for (tid, pid, timings, _), (_, arrays), td in zip(rows, parts, bodies, strict=True):
        td["output_ids"], td["output_logprobs"], td["output_mask"], td["prompt_ids"] = arrays
        out.append(turn_dict(tid, pid, timings, td))
    return out


def _from_legacy(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    bodies = json.loads("[" + ",".join([r[3] for r in rows]) + "]") if rows else []
    out = []
    for r, td in zip(rows, bodies, strict=True):
        for (name, code), data in zip(_LEGACY_ARRAYS, r[4:], strict=True):
            if data is not None:  # NULL: the array is in the body as JSON
                td[name] = unpack_array(data, code)
        out.append(turn_dict(r[0], r[1], r[2], td))
    return out
