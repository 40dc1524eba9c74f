"""Behaviour shared by the backends: paging, iteration, media, export and SQL filter text.

A backend subclasses :class:`BaseStore` and provides the abstract methods, among them ``_rows``
(one keyset page of index rows in either order) and ``_fetch`` (whole episodes by id);
what the protocol derives from those (query pages, cursors, iteration, media, export) lives
here once, and so does the splicing of shared prefixes: a branch or tree continuation's record
keeps only its own turns (:func:`~arborl.store.codec.shared_prefix`), and every read puts its
trunk's prefix turns back in front of them (:meth:`BaseStore._with_prefixes`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from arborl.store.base import (
    EpisodeNotFound,
    Filters,
    IndexRow,
    Page,
    ProfileRow,
    StoreConfig,
    StoreError,
    check_limit,
    decode_cursor,
    encode_cursor,
)
from arborl.store.blob import BlobStore
from arborl.trajectory.schema import Episode, MediaRef, Turn


class BaseStore(ABC):
    """Derived operations on top of a backend's primitives (the abstract methods below)."""

    blobs: BlobStore
    config: StoreConfig

    # --- provided by backends ------------------------------------------------------------------
    @abstractmethod
    def _rows(self, f: Filters, *, descending: bool, limit: int,
              after: tuple[float, Any] | None) -> list[tuple[IndexRow, Any]]:
        """Up to ``limit`` index rows after the keyset position, with each row's tiebreak key."""

    @abstractmethod
    def _fetch(self, episode_ids: list[str]) -> dict[str, Episode]:
        """The stored episodes among ``episode_ids``, by id, each whole (read from one snapshot)."""

    @abstractmethod
    def put_many(self, episodes: Iterable[Episode | dict[str, Any]]) -> list[str]:
        """See :class:`~arborl.store.base.TrajectoryStore`."""

    @abstractmethod
    def index_row(self, episode_id: str) -> IndexRow:
        """The index row of one episode; :class:`~arborl.store.base.EpisodeNotFound` if absent."""

    @abstractmethod
    def slice(self, episode_id: str, start: int = 0, stop: int | None = None) -> list[Turn]:
        """See :class:`~arborl.store.base.TrajectoryStore`."""

    @abstractmethod
    def count(self, **filters: Any) -> int:
        """See :class:`~arborl.store.base.TrajectoryStore`."""

    @abstractmethod
    def profile(self, group_by: Sequence[str] = ("task_type", "policy_version"), **filters: Any) -> list[ProfileRow]:
        """See :class:`~arborl.store.base.TrajectoryStore`."""

    @abstractmethod
    def expire(self, older_than: timedelta | None = None, task_type: str | None = None,
               now: float | None = None) -> int:
        """See :class:`~arborl.store.base.TrajectoryStore`."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and the blob store."""

    # --- derived -----------------------------------------------------------------------------
    def get_many(self, episode_ids: Sequence[str]) -> list[Episode]:
        """Episodes in the order of ``episode_ids``, each read whole.

        Raises:
            EpisodeNotFound: an id is not stored.
            SchemaError: a record was written by a newer arborl.
        """
        ids = list(episode_ids)
        got = self._with_prefixes(self._fetch(ids))
        missing = next((eid for eid in ids if eid not in got), None)
        if missing is not None:
            raise EpisodeNotFound(missing)
        return [got[eid] for eid in ids]

    def _load_many(self, rows: Sequence[IndexRow]) -> list[Episode]:
        """Episodes for index rows, in the same order; those expired since the rows were read are skipped.

        So a query page or an iteration over a store that another process expires meanwhile
        returns whole episodes only, and never fails on one that vanished.
        """
        got = self._with_prefixes(self._fetch([r.episode_id for r in rows])) if rows else {}
        return [got[r.episode_id] for r in rows if r.episode_id in got]

    def _with_prefixes(self, got: dict[str, Episode]) -> dict[str, Episode]:
        """``got`` with each continuation's shared prefix turns spliced in front of its own, in place.

        A continuation's first stored turn names a turn of its trunk (``origin.of``) as parent;
        the trunk's path to that turn is read (from ``got`` or the store, level by level for
        continuations of continuations) and becomes the continuation's first turns.

        Raises:
            StoreError: the trunk or its turn is no longer stored (expired before its continuation).
        """
        known = dict(got)
        for _ in range(_MAX_DEPTH):
            todo = [ep for ep in known.values() if _dangling(ep)]
            if not todo:
                return got
            wanted = sorted({ep.origin.of for ep in todo} - known.keys())  # type: ignore[union-attr]
            if wanted:
                known.update(self._fetch(wanted))
            spliced = 0
            for ep in todo:
                trunk = known.get(ep.origin.of)  # type: ignore[union-attr]
                if trunk is None or not _dangling(trunk):
                    _splice(ep, trunk)
                    spliced += 1
            if not spliced and not wanted:
                break
        raise StoreError(f"a chain of continuations in {sorted(got)} does not end in a stored trunk within "
                         f"{_MAX_DEPTH} levels; check their origins")

    def _page(self, limit: int, cursor: str | None, order: str,
              filters: dict[str, Any]) -> tuple[list[IndexRow], str | None]:
        check_limit(limit)
        if order not in ("newest", "oldest"):
            raise ValueError(f"order must be 'newest' or 'oldest', got {order!r}")
        after = decode_cursor(cursor) if cursor else None
        got = self._rows(Filters.make(**filters), descending=order == "newest", limit=limit + 1, after=after)
        more = len(got) > limit
        got = got[:limit]
        nxt = encode_cursor(got[-1][0].created_at, got[-1][1]) if more else None
        return [r for r, _ in got], nxt

    def query(self, *, limit: int = 100, cursor: str | None = None, order: str = "newest",
              **filters: Any) -> Page:
        """A page of matching episodes, newest first; pass ``page.next_cursor`` for the next page.

        Args:
            limit: Page size.
            cursor: ``next_cursor`` of the previous page (of the same order).
            order: ``"newest"`` (default) or ``"oldest"`` first, by ``created_at``, ties by insertion order.
            **filters: Keyword filters of :class:`~arborl.store.base.Filters`.
        """
        rows, nxt = self._page(limit, cursor, order, filters)
        return Page(self._load_many(rows), nxt)

    def query_index(self, *, limit: int = 100, cursor: str | None = None, order: str = "newest",
                    **filters: Any) -> tuple[list[IndexRow], str | None]:
        """Like :meth:`query` but returns index rows only (no body reads)."""
        return self._page(limit, cursor, order, filters)

    def iter_rows(self, *, batch_size: int = 1000, **filters: Any) -> Iterator[IndexRow]:
        """Every matching index row, oldest first, read in keyset pages."""
        f = Filters.make(**filters)
        after = None
        while True:
            got = self._rows(f, descending=False, limit=check_limit(batch_size), after=after)
            for r, _ in got:
                yield r
            if len(got) < batch_size:
                return
            after = (got[-1][0].created_at, got[-1][1])

    def iter_episodes(self, *, batch_size: int = 256, **filters: Any) -> Iterator[Episode]:
        """Every matching episode, oldest first (ties in insertion order), streamed page by page.

        The order is stable, so two passes over an unchanged store give the same sequence.
        """
        f = Filters.make(**filters)
        after = None
        while True:
            got = self._rows(f, descending=False, limit=check_limit(batch_size), after=after)
            yield from self._load_many([r for r, _ in got])
            if len(got) < batch_size:
                return
            after = (got[-1][0].created_at, got[-1][1])

    def get(self, episode_id: str) -> Episode:
        """The stored episode; raises :class:`~arborl.store.base.EpisodeNotFound` if absent."""
        return self.get_many([episode_id])[0]

    def put_media(self, data: bytes, mime: str = "application/octet-stream") -> MediaRef:
        """Store media bytes by content hash in the blob store; reference them from a Turn.

        Args:
            data: The bytes (image, audio, file).
            mime: MIME type.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"put_media takes bytes, got {type(data).__name__}")
        data = bytes(data)
        return MediaRef(url=self.blobs.put(data), mime=mime, sha256=hashlib.sha256(data).hexdigest())

    def get_media(self, ref: MediaRef | str) -> bytes:
        """Bytes of media stored with :meth:`put_media`."""
        return self.blobs.get(ref.url if isinstance(ref, MediaRef) else ref)

    def export_parquet(self, path: str, **filters: Any) -> int:
        """Write matching episodes to Parquet, one row per turn; return the number of rows.

        Columns are listed in :mod:`arborl.store.export`.
        """
        from arborl.store.export import write_parquet

        return write_parquet(self, path, **filters)

    def __enter__(self) -> BaseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_MAX_DEPTH = 64
"""Deepest chain of continuations of continuations that a read follows."""


def _dangling(ep: Episode | None) -> bool:
    """A continuation read without its shared prefix: its first turn's parent is in its trunk."""
    return ep is not None and ep.origin is not None and bool(ep.turns) and ep.turns[0].parent_id is not None


def _splice(ep: Episode, trunk: Episode | None) -> None:
    """Put ``trunk``'s path up to ``ep``'s first parent in front of ``ep``'s turns."""
    parent = ep.turns[0].parent_id
    try:
        if trunk is None:
            raise KeyError(parent)
        prefix = trunk.path(parent)
    except KeyError:
        raise StoreError(f"episode {ep.episode_id} continues turn {parent} of episode {ep.origin.of}, which is not "  # type: ignore[union-attr]
                         "stored; expire continuations with their trunks") from None
    ep.turns[:0] = prefix


def profile_of(rows: Iterable[IndexRow], cols: tuple[str, ...]) -> list[ProfileRow]:
    """Count, success rate, mean reward and mean turns per group of ``cols`` (sorted by value as text).

    For backends that aggregate index rows client-side (Redis, DynamoDB).
    """
    acc: dict[tuple[Any, ...], list[float]] = {}
    for r in rows:
        a = acc.setdefault(tuple(getattr(r, c) for c in cols), [0, 0, 0, 0.0, 0.0])
        a[0] += 1
        a[1] += r.success is not None
        a[2] += bool(r.success)
        a[3] += r.reward
        a[4] += r.n_turns
    return [ProfileRow(dict(zip(cols, k, strict=True)), int(n), int(ns), (s / ns) if ns else None, rw / n, t / n)
            for k, (n, ns, s, rw, t) in sorted(acc.items(), key=lambda kv: [str(x) for x in kv[0]])]


def sql_where(f: Filters, ph: str) -> tuple[list[str], list[Any]]:
    """SQL conditions (without tags) for a :class:`Filters`, with ``ph`` as the placeholder."""
    conds: list[str] = []
    args: list[Any] = []
    for col, op, val in (
        ("task_type", "=", f.task_type), ("reward", ">=", f.min_reward), ("reward", "<=", f.max_reward),
        ("created_at", ">=", f.since), ("created_at", "<", f.until),
        ("policy_version", "=", f.policy_version), ("source", "=", f.source),
        ("iteration", "=", f.iteration), ("iteration", ">=", f.min_iteration),
        ("iteration", "<=", f.max_iteration), ("stop_reason", "=", f.stop_reason),
    ):
        if val is not None:
            conds.append(f"{col} {op} {ph}")
            args.append(val)
    if f.success is not None:
        conds.append(f"success = {ph}")
        args.append(f.success)
    return conds, args


def keyset_condition(descending: bool, after: tuple[float, Any] | None, key: str,
                     ph: str) -> tuple[list[str], list[Any]]:
    """Condition that resumes after ``after`` = (created_at, tiebreak key) in the given order."""
    if after is None:
        return [], []
    op = "<" if descending else ">"
    return [f"(created_at {op} {ph} OR (created_at = {ph} AND {key} {op} {ph}))"], [after[0], after[0], after[1]]


def expiry_rules(cfg: StoreConfig, older_than: timedelta | None,
                  task_type: str | None) -> list[tuple[str | None, timedelta, list[str]]]:
    """(task_type or None for all, ttl, task types to exclude) for one expire call."""
    if older_than is not None:
        return [(task_type, older_than, [])]
    if task_type is not None:
        ttl = cfg.ttl_for(task_type)
        return [] if ttl is None else [(task_type, ttl, [])]
    rules: list[tuple[str | None, timedelta, list[str]]] = [
        (t, ttl, []) for t, ttl in cfg.ttl_by_task_type.items()]
    if cfg.default_ttl is not None:
        rules.append((None, cfg.default_ttl, list(cfg.ttl_by_task_type)))
    return rules
