"""Turning episodes into store rows and back, identically for every backend.

An episode is split into

* its *meta*: every field except ``turns``, as JSON;
* its turns, in creation order, each as its real ``turn_id``/``parent_id``, its position on the
  main path (``None`` off it), its step reward, its ``timings`` JSON, and its canonical form from
  :func:`~arborl.trajectory.canonical.canonical_turns`: the very pieces
  :func:`~arborl.trajectory.canonical.content_hash` hashes, so one encoding serves storage and dedup. SQLite stores
  each turn's frames of the canonical form as they are (:data:`TurnCols`: token arrays packed
  little-endian, the rest JSON); PostgreSQL and Redis store the turn's canonical JSON with its
  arrays as JSON (:meth:`Prepared.turn_rows`);
* its :class:`~arborl.store.base.IndexRow`.

Validation (:meth:`Episode.validate`, the schema's one set of rules) happens here, before any
backend writes, so a malformed episode fails the whole ``put_many`` with a :class:`SchemaError`
that names the field, the same on every backend. Reading builds the dataclasses
directly with the same field checks as :meth:`Episode.from_dict` (which is several times slower
because it re-derives the field list per turn) and falls back to ``from_dict`` on any mismatch,
so errors come from the schema's own parser.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from arborl.store.base import IndexRow, check_schema_version
from arborl.trajectory.canonical import CanonicalTurn, canonical_turns, compact_json_encoder, content_hash
from arborl.trajectory.schema import (
    EPISODE_FIELDS,
    TURN_FIELDS,
    Episode,
    MediaRef,
    Origin,
    SchemaError,
    ToolCall,
    Turn,
    plain,
    upgrade_record,
)

_json = compact_json_encoder(sort_keys=False)
_TURN_KEYS = frozenset(TURN_FIELDS)
if EPISODE_FIELDS != ("episode_id", "task_id", "task_type", "group_id", "seed", "rewards", "stop_reason",
                       "policy_version", "iteration", "source", "tags", "created_at", "metadata", "origin",
                       "schema_version"):
    raise ImportError("Episode's fields changed: update _meta below to write every one of them "
                      "(docs/trajectory.md: adding a field)")
_EPISODE_KEYS = frozenset(EPISODE_FIELDS) | {"turns"}


@dataclass(slots=True)
class TurnRow:
    """One turn with a JSON body (the PostgreSQL and Redis bodies; see the module docstring)."""

    seq: int
    path_index: int | None
    turn_id: str
    parent_id: str | None
    reward: float
    timings: str
    body: str
    """The turn's canonical JSON, token arrays included."""


TurnCols = tuple[int | None, str, str | None, float, str, bytes]
"""One turn's stored columns: (path_index, turn_id, parent_id, reward, timings JSON, record), where
``record`` is its frames of the canonical form (:attr:`CanonicalTurn.record`)."""


@dataclass(slots=True)
class Prepared:
    """A validated episode split into index row, meta JSON and turn columns."""

    episode: Episode
    row: IndexRow
    meta: str
    canon: list[CanonicalTurn]
    """Canonical pieces of each turn, in creation order."""
    turns: list[TurnCols]
    """Stored columns of each turn, in creation order."""

    def turn_rows(self) -> list[TurnRow]:
        """The turns with their canonical JSON bodies, for backends that store turns as JSON."""
        return [TurnRow(i, pi, tid, pid, reward, timings, c.text())
                for i, ((pi, tid, pid, reward, timings, _), c) in enumerate(zip(self.turns, self.canon, strict=True))]


def _dumps(obj: Any, where: str) -> str:
    try:
        return _json(obj)
    except (ValueError, TypeError) as e:
        raise SchemaError(f"{where} is not JSON-able with finite numbers: {e}") from e


def _canonical(ep: Episode) -> list[CanonicalTurn]:
    try:
        return canonical_turns(ep)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        ep.validate()  # names the field that the encoder could not take
        raise SchemaError(f"episode {ep.episode_id} is not JSON-able with finite numbers: {e}") from e


def _value(v: Any) -> str:
    """One value as :data:`_json` writes it, with the usual scalar types formatted directly."""
    t = type(v)
    if t is str:
        return encode_basestring_ascii(v)
    if t is int:
        return int.__repr__(v)
    if t is float and v - v == 0.0:  # finite
        return float.__repr__(v)
    return "null" if v is None else _json(v)


def _meta(ep: Episode) -> str:
    """``_json`` of the dict of the episode's fields but ``turns`` (in field order), written directly."""
    v = _value
    try:
        return (f'{{"episode_id":{v(ep.episode_id)},"task_id":{v(ep.task_id)},"task_type":{v(ep.task_type)},'
                f'"group_id":{v(ep.group_id)},"seed":{v(ep.seed)},"rewards":{v(ep.rewards)},'
                f'"stop_reason":{v(ep.stop_reason)},"policy_version":{v(ep.policy_version)},'
                f'"iteration":{v(ep.iteration)},"source":{v(ep.source)},"tags":{v(ep.tags)},'
                f'"created_at":{v(ep.created_at)},"metadata":{v(ep.metadata)},'
                f'"origin":{"null" if ep.origin is None else _json(plain(ep.origin))},'
                f'"schema_version":{v(ep.schema_version)}}}')
    except (ValueError, TypeError) as e:
        raise SchemaError(f"episode {ep.episode_id} is not JSON-able with finite numbers: {e}") from e


def _timings(ep: Episode, t: Turn) -> str:
    tim = t.timings
    return "{}" if type(tim) is dict and not tim else _dumps(tim, f"episode {ep.episode_id} turn {t.turn_id}")


def shared_prefix(ep: Episode) -> int:
    """How many of ``ep``'s first turns are its trunk's (kept in the trunk's record, not in ``ep``'s).

    An episode with an :class:`~arborl.trajectory.schema.Origin` whose path starts with a prefix
    ending in a turn of the trunk shares the ``origin.turn`` turns of its path before its own:
    the rollout engine puts the trunk's very turns there. A version-1 branch (its re-played turns
    copied under new ids, the first a root) and an episode without origin share none.
    """
    o = ep.origin
    if o is None or o.turn == 0 or ep.schema_version < 2 or len(ep.turns) <= o.turn:
        return 0
    return o.turn


def _turn_cols(ep: Episode, canon: list[CanonicalTurn], skip: int) -> tuple[list[TurnCols], list[CanonicalTurn]]:
    """The stored columns and canonical pieces of the turns ``ep``'s record keeps (all but a shared prefix)."""
    path = ep.path()
    pos = {t.turn_id: i for i, t in enumerate(path)}
    prefix = {t.turn_id for t in path[:skip]}
    kept = [(t, c) for t, c in zip(ep.turns, canon, strict=True) if t.turn_id not in prefix] if skip else \
        list(zip(ep.turns, canon, strict=True))
    cols = [(pos.get(t.turn_id), t.turn_id, t.parent_id, float(t.reward), _timings(ep, t), c.record) for t, c in kept]
    return cols, [c for _, c in kept]


def prepare(item: Episode | dict[str, Any]) -> Prepared:
    """Validate one episode (or episode dict) and split it into rows.

    Raises:
        SchemaError: naming the malformed field (unknown/missing fields, newer schema version,
            non-finite rewards or log-probs, wrong types, non-JSON-able extras).
    """
    ep = Episode.from_dict(item) if isinstance(item, dict) else item
    if not isinstance(ep, Episode):
        raise SchemaError(f"put_many takes Episode objects or episode dicts, got {type(ep).__name__}")
    canon = _canonical(ep)
    ep.validate(checked=[c.checked for c in canon])
    turns, stored = _turn_cols(ep, canon, shared_prefix(ep))
    meta = _meta(ep)
    path_rewards = [t.reward for t in ep.path()]
    row = IndexRow(
        episode_id=ep.episode_id, task_id=ep.task_id, task_type=ep.task_type, group_id=ep.group_id,
        source=ep.source, iteration=ep.iteration, policy_version=ep.policy_version,
        reward=float(sum(path_rewards)), success=ep.success, n_turns=len(path_rewards),
        n_nodes=len(turns), stop_reason=ep.stop_reason, content_hash=content_hash(ep, canon),
        created_at=float(ep.created_at), tags=list(ep.tags), schema_version=ep.schema_version,
    )
    return Prepared(ep, row, meta, stored, turns)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one ``put_many`` (encoding plus row building).

    A batch allocates tens of thousands of short-lived tuples and lists; every 700 allocations
    would start a collection that walks the tracked objects, and with many episodes alive in
    the caller that was a quarter of ingest time. Refcounting frees these objects; any cycle is
    collected once the collector resumes. The pause is process-wide (other threads' garbage waits
    too) and lasts one batch; the collector is left as it was found (disabled stays disabled).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def prepare_many(items: Iterable[Episode | dict[str, Any]]) -> list[Prepared]:
    """:func:`prepare` for a batch, with the cyclic garbage collector paused (:func:`gc_paused`)."""
    with gc_paused():
        return [prepare(e) for e in items]


def _load(x: str | dict[str, Any] | list[Any]) -> Any:
    return json.loads(x) if isinstance(x, str | bytes) else x


def turn_dict(turn_id: str, parent_id: str | None, timings: str | dict[str, float],
              body: str | dict[str, Any]) -> dict[str, Any]:
    """The ``to_dict`` form of a stored turn from its columns and canonical body."""
    td = json.loads(body) if isinstance(body, str) else body
    td["turn_id"], td["parent_id"] = turn_id, parent_id
    td["timings"] = {} if timings == "{}" else _load(timings)
    return td


def _fast_turn(td: dict[str, Any]) -> Turn:
    if not td.keys() <= _TURN_KEYS:
        raise SchemaError("unknown turn field")  # caller falls back to from_dict for the message
    td = dict(td)  # keep the caller's dict intact for the from_dict fallback
    td["media"] = [MediaRef(**m) for m in td.get("media", ())]
    tc = td.get("tool_call")
    td["tool_call"] = None if tc is None else ToolCall(**tc)
    return Turn(**td)


def episode_from(episode_id: str, schema_version: int, meta: str | dict[str, Any],
                 turns: list[dict[str, Any]]) -> Episode:
    """Rebuild an episode from its meta and its turns in ``to_dict`` form (creation order).

    Raises:
        SchemaError: the record was written by a newer arborl, or does not parse.
    """
    check_schema_version(episode_id, schema_version)
    d = upgrade_record(dict(_load(meta)))
    try:
        if d.get("schema_version") != schema_version or not d.keys() <= _EPISODE_KEYS:
            raise SchemaError("meta does not match the index row")
        origin = d.get("origin")
        return Episode(**{**d, "origin": None if origin is None else Origin(**origin)},
                       turns=[_fast_turn(td) for td in turns])
    except (TypeError, SchemaError):
        d["turns"] = turns
        return Episode.from_dict(d)  # the schema's parser names what is wrong


def turns_from(episode_id: str, schema_version: int, turns: list[dict[str, Any]]) -> list[Turn]:
    """Rebuild some turns of an episode (for ``slice``)."""
    check_schema_version(episode_id, schema_version)
    try:
        return [_fast_turn(td) for td in turns]
    except (TypeError, SchemaError):
        # from_dict does not require parents to be present (validate() does), so a partial list parses.
        return Episode.from_dict({"schema_version": schema_version, "episode_id": episode_id,
                                  "turns": turns}).turns


def to_blob(p: Prepared) -> bytes:
    """One episode as a self-contained JSON document (for blob-backed bodies)."""
    rows = ",".join(
        f"[{_json(t.turn_id)},{_json(t.parent_id)},{_json(t.path_index)},{t.timings},{t.body}]"
        for t in p.turn_rows())
    return ('{"v":1,"meta":' + p.meta + ',"turns":[' + rows + "]}").encode()


def from_blob(episode_id: str, schema_version: int, data: bytes,
              start: int | None = None, stop: int | None = None) -> tuple[Episode | None, list[Turn]]:
    """Inverse of :func:`to_blob`: the episode, or (with ``start``) only its main-path slice."""
    check_schema_version(episode_id, schema_version)
    doc = json.loads(data)
    if doc.get("v") != 1:
        raise SchemaError(f"episode {episode_id}: body blob format {doc.get('v')!r} is unknown; upgrade arborl")
    if start is None:
        turns = [turn_dict(tid, pid, tim, body) for tid, pid, _, tim, body in doc["turns"]]
        return episode_from(episode_id, schema_version, doc["meta"], turns), []
    hi = 2**62 if stop is None else stop
    picked = sorted((pi, turn_dict(tid, pid, tim, body)) for tid, pid, pi, tim, body in doc["turns"]
                    if pi is not None and start <= pi < hi)
    return None, turns_from(episode_id, schema_version, [td for _, td in picked])


def dedup_batch(prepared: list[Prepared]) -> tuple[list[Prepared], dict[str, str]]:
    """Drop in-batch duplicates; map each dropped episode id to the id kept for its content.

    Raises:
        SchemaError: if two different episodes in the batch share an episode_id.
    """
    first_by_hash: dict[str, str] = {}
    hash_by_id: dict[str, str] = {}
    alias: dict[str, str] = {}
    unique: list[Prepared] = []
    for p in prepared:
        eid, h = p.row.episode_id, p.row.content_hash
        if eid in hash_by_id and hash_by_id[eid] != h:
            raise SchemaError(f"episode_id {eid} appears twice in one put_many with different content")
        hash_by_id[eid] = h
        if h in first_by_hash:
            alias[eid] = first_by_hash[h]
            continue
        first_by_hash[h] = eid
        unique.append(p)
    return unique, alias
