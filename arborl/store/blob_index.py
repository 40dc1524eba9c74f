"""What the index-only backends (Redis, DynamoDB) share: index rows in the database, each
episode's body one compressed blob in the blob store, written before its index entry and
deleted after it.

A backend subclasses :class:`BlobIndexStore` and provides ``_scan`` (matching rows in keyset
order), ``_index_rows`` (the live rows among some ids) and ``_indexed`` (whether an id is still
indexed); paging, whole-episode reads, slices and profiles follow from those here.
"""

from __future__ import annotations

import zlib
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from arborl.store.base import EpisodeNotFound, Filters, IndexRow, ProfileRow, StoreError, check_group_by
from arborl.store.codec import from_blob
from arborl.store.common import BaseStore, profile_of
from arborl.trajectory.schema import Episode, Turn


class BlobIndexStore(BaseStore):
    """Reads of a backend that keeps index rows in a database and bodies as blobs."""

    _pool: ThreadPoolExecutor
    """Worker threads for body GETs (latency-bound on S3)."""

    @abstractmethod
    def _scan(self, f: Filters, descending: bool, after: tuple[float, Any] | None) -> Iterator[IndexRow]:
        """Live rows matching ``f`` in (created_at, episode id) order after the keyset position."""

    @abstractmethod
    def _index_rows(self, ids: list[str]) -> list[IndexRow]:
        """The live index rows among ``ids`` (absent ones left out)."""

    @abstractmethod
    def _indexed(self, episode_id: str) -> bool:
        """Whether the episode is still in the index."""

    def _rows(self, f: Filters, *, descending: bool, limit: int,
              after: tuple[float, Any] | None) -> list[tuple[IndexRow, Any]]:
        out = []
        for row in self._scan(f, descending, after):
            out.append((row, row.episode_id))
            if len(out) == limit:
                break
        return out

    def _body(self, r: IndexRow) -> bytes | None:
        """The body blob of an index row; ``None`` if the episode was expired since the row was read."""
        try:
            return zlib.decompress(self.blobs.get(r.body_url or ""))
        except StoreError:
            if self._indexed(r.episode_id):
                raise  # still indexed: the blob is really missing
            return None

    def _fetch(self, ids: list[str]) -> dict[str, Episode]:
        """Index rows, then bodies in parallel; an episode expired in between is left out.

        A body is immutable and deleted only after its index entry, so an episode is either read
        whole or found gone: never half of it.
        """
        rows = self._index_rows(list(dict.fromkeys(ids)))

        def load(r: IndexRow) -> Episode | None:
            data = self._body(r)
            return None if data is None else from_blob(r.episode_id, r.schema_version, data)[0]

        return {r.episode_id: ep for r, ep in zip(rows, self._pool.map(load, rows), strict=True) if ep is not None}

    def slice(self, episode_id: str, start: int = 0, stop: int | None = None) -> list[Turn]:
        """Turns ``start..stop-1`` along the main path (one body GET; only those turns decoded)."""
        if start < 0 or (stop is not None and stop < 0):
            raise ValueError("slice takes non-negative start/stop; read n_turns from the index row for the length")
        r = self.index_row(episode_id)
        data = self._body(r)
        if data is None:
            raise EpisodeNotFound(episode_id)
        return from_blob(r.episode_id, r.schema_version, data, start, stop)[1]

    def profile(self, group_by: Sequence[str] = ("task_type", "policy_version"), **filters: Any) -> list[ProfileRow]:
        """Count, success rate, mean reward and mean turns per group (reads every matching row)."""
        return profile_of(self._scan(Filters.make(**filters), True, None), check_group_by(group_by))
