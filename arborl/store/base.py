"""The trajectory store contract, shared by every backend.

A store keeps :class:`~arborl.trajectory.schema.Episode` records. Each episode has a small
*index row* (:class:`IndexRow`, about 1 KB: ids, task type, source, iteration, policy version,
reward, success, turn counts, stop reason, content hash, creation time, tags) kept apart from
its *body* (the turns). Queries filter and sort on index rows only; bodies are read for the
episodes a query returns.

Definitions used by every backend:

* ``reward`` of an episode is :attr:`Episode.total_reward` (sum of step rewards along the main
  path, i.e. the path to the most recently created leaf); ``success`` is
  :attr:`Episode.success` (``rewards["success"] > 0``, ``None`` when not scored).
* ``n_turns`` is the length of the main path; ``n_nodes`` the number of turns in the tree.
* Deduplication uses :meth:`Episode.content_hash`: storing an episode whose content hash is
  already present stores nothing and returns the id of the stored one.
* Order: :meth:`TrajectoryStore.query` is newest first by ``created_at``;
  :meth:`TrajectoryStore.iter_episodes` is oldest first. Ties are broken by insertion order.
* ``since`` is inclusive, ``until`` exclusive. Times are unix seconds or ``datetime`` (naive
  datetimes are taken as UTC).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from arborl.trajectory.schema import SCHEMA_VERSION, Episode, MediaRef, SchemaError, Turn


class StoreError(RuntimeError):
    """The store cannot do what was asked (bad URL, conflicting id, unreadable data)."""


class EpisodeNotFound(KeyError):
    """No episode with this id is stored."""


GROUP_BY_COLUMNS = ("task_type", "policy_version", "source", "iteration", "stop_reason", "task_id")
"""Index columns :meth:`TrajectoryStore.profile` may group by."""


def to_timestamp(t: float | int | datetime | None, name: str) -> float | None:
    """Unix seconds from a number or a datetime (naive datetimes are UTC)."""
    if t is None:
        return None
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
        return float(t)
    raise ValueError(f"{name} must be unix seconds or a datetime, got {t!r}")


@dataclass(frozen=True)
class Filters:
    """Which episodes a query, count, profile, export or iteration covers (all optional, ANDed).

    Attributes:
        task_type: Exact task type.
        min_reward: ``reward >= min_reward`` (reward = :attr:`Episode.total_reward`).
        max_reward: ``reward <= max_reward``.
        since: ``created_at >= since`` (unix seconds or datetime).
        until: ``created_at < until``.
        policy_version: Exact policy version of the episode.
        tags: Episodes carrying *all* of these tags.
        source: Exact source ("synth", "rl", "eval", ...).
        iteration: Exact training iteration.
        min_iteration: ``iteration >= min_iteration``.
        max_iteration: ``iteration <= max_iteration``.
        success: ``True``/``False`` keeps scored episodes that succeeded/failed.
        stop_reason: Exact stop reason (``"terminated"``, ``"env_error"``, ``"max_context"``, ...).
    """

    task_type: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    since: float | None = None
    until: float | None = None
    policy_version: int | None = None
    tags: tuple[str, ...] | None = None
    source: str | None = None
    iteration: int | None = None
    min_iteration: int | None = None
    max_iteration: int | None = None
    success: bool | None = None
    stop_reason: str | None = None

    @classmethod
    def make(cls, **kw: Any) -> Filters:
        """Build from keyword filters, normalising times and tags; unknown names are an error."""
        known = set(cls.__dataclass_fields__)
        unknown = set(kw) - known
        if unknown:
            raise TypeError(f"unknown store filter(s) {sorted(unknown)}; known filters are {sorted(known)}")
        kw["since"] = to_timestamp(kw.get("since"), "since")
        kw["until"] = to_timestamp(kw.get("until"), "until")
        tags = kw.get("tags")
        if isinstance(tags, str):
            tags = [tags]
        kw["tags"] = tuple(tags) if tags else None
        return cls(**kw)

    def matches(self, row: IndexRow) -> bool:
        """Whether an index row passes every filter (used by backends that filter client-side)."""
        checks = (
            self.task_type is None or row.task_type == self.task_type,
            self.min_reward is None or row.reward >= self.min_reward,
            self.max_reward is None or row.reward <= self.max_reward,
            self.since is None or row.created_at >= self.since,
            self.until is None or row.created_at < self.until,
            self.policy_version is None or row.policy_version == self.policy_version,
            not self.tags or set(self.tags) <= set(row.tags),
            self.source is None or row.source == self.source,
            self.iteration is None or row.iteration == self.iteration,
            self.min_iteration is None or row.iteration >= self.min_iteration,
            self.max_iteration is None or row.iteration <= self.max_iteration,
            self.success is None or row.success is self.success,
            self.stop_reason is None or row.stop_reason == self.stop_reason,
        )
        return all(checks)


@dataclass
class IndexRow:
    """The queryable summary of one stored episode (see the module docstring for definitions)."""

    episode_id: str
    task_id: str
    task_type: str
    group_id: str
    source: str
    iteration: int
    policy_version: int
    reward: float
    success: bool | None
    n_turns: int
    n_nodes: int
    stop_reason: str
    content_hash: str
    created_at: float
    tags: list[str]
    schema_version: int
    body_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return dict(self.__dict__)


@dataclass
class Page:
    """One page of a query: episodes newest first, and the cursor for the next page."""

    episodes: list[Episode]
    next_cursor: str | None

    @property
    def items(self) -> list[Episode]:
        """Alias of :attr:`episodes`."""
        return self.episodes


@dataclass
class ProfileRow:
    """Capability profile of one group of episodes.

    Attributes:
        group: Values of the grouped columns, e.g. ``{"task_type": "search", "policy_version": 3}``.
        count: Number of episodes.
        n_scored: Episodes with a ``success`` score.
        success_rate: Fraction of scored episodes that succeeded (``None`` if none scored).
        mean_reward: Mean of ``reward``.
        mean_turns: Mean main-path length.
    """

    group: dict[str, Any]
    count: int
    n_scored: int
    success_rate: float | None
    mean_reward: float
    mean_turns: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {**self.group, "count": self.count, "n_scored": self.n_scored,
                "success_rate": self.success_rate, "mean_reward": self.mean_reward,
                "mean_turns": self.mean_turns}


@dataclass(frozen=True)
class StoreConfig:
    """Settings shared by backends.

    Attributes:
        ttl_by_task_type: Retention per task type, applied by :meth:`TrajectoryStore.expire`
            (and at write time as EXPIREAT by the Redis index).
        default_ttl: Retention for task types not in ``ttl_by_task_type`` (``None``: keep).
    """

    ttl_by_task_type: Mapping[str, timedelta] = field(default_factory=dict)
    default_ttl: timedelta | None = None

    def ttl_for(self, task_type: str) -> timedelta | None:
        """The retention of one task type, or ``None`` to keep forever."""
        return self.ttl_by_task_type.get(task_type, self.default_ttl)


@runtime_checkable
class TrajectoryStore(Protocol):
    """What every backend offers. Filters are the keyword arguments of :class:`Filters`."""

    def put_many(self, episodes: Iterable[Episode | dict[str, Any]]) -> list[str]:
        """Store episodes atomically (all or none); return their ids (existing id for a duplicate)."""
        ...

    def get(self, episode_id: str) -> Episode:
        """The stored episode; :class:`EpisodeNotFound` if absent."""
        ...

    def get_many(self, episode_ids: Sequence[str]) -> list[Episode]:
        """Episodes in the order of ``episode_ids``; :class:`EpisodeNotFound` if one is absent."""
        ...

    def query(self, *, limit: int = 100, cursor: str | None = None, order: str = "newest", **filters: Any) -> Page:
        """A page of matching episodes, newest first (``order="oldest"``: oldest first)."""
        ...

    def query_index(self, *, limit: int = 100, cursor: str | None = None, order: str = "newest",
                    **filters: Any) -> tuple[list[IndexRow], str | None]:
        """Like :meth:`query`, returning index rows only (no body reads)."""
        ...

    def count(self, **filters: Any) -> int:
        """Number of matching episodes."""
        ...

    def iter_episodes(self, *, batch_size: int = 256, **filters: Any) -> Iterator[Episode]:
        """Every matching episode, oldest first, read page by page."""
        ...

    def iter_rows(self, *, batch_size: int = 1000, **filters: Any) -> Iterator[IndexRow]:
        """Every matching index row, oldest first (no body reads)."""
        ...

    def index_row(self, episode_id: str) -> IndexRow:
        """The index row of one episode."""
        ...

    def slice(self, episode_id: str, start: int = 0, stop: int | None = None) -> list[Turn]:
        """Turns ``start..stop-1`` along the episode's main path."""
        ...

    def expire(self, older_than: timedelta | None = None, task_type: str | None = None,
               now: float | None = None) -> int:
        """Delete old episodes (``older_than``, else the configured TTLs); return how many."""
        ...

    def profile(self, group_by: Sequence[str] = ("task_type", "policy_version"), **filters: Any) -> list[ProfileRow]:
        """Count, success rate, mean reward and mean turns per group."""
        ...

    def put_media(self, data: bytes, mime: str = "application/octet-stream") -> MediaRef:
        """Store media bytes in the blob store by content hash; return a reference."""
        ...

    def get_media(self, ref: MediaRef | str) -> bytes:
        """Bytes of stored media."""
        ...

    def export_parquet(self, path: str, **filters: Any) -> int:
        """Write matching episodes as Parquet, one row per turn; return the row count."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


# --- cursors ------------------------------------------------------------------------------
def encode_cursor(created_at: float, key: int | str) -> str:
    """Opaque keyset cursor: the (created_at, tiebreak key) of the last row returned."""
    return base64.urlsafe_b64encode(json.dumps([created_at, key]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, Any]:
    """Inverse of :func:`encode_cursor`; a clear error for a cursor from elsewhere."""
    try:
        created_at, key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(created_at), key
    except (ValueError, TypeError) as e:
        raise ValueError(f"invalid cursor {cursor!r}; pass the next_cursor of a previous page") from e


def check_group_by(group_by: Sequence[str]) -> tuple[str, ...]:
    """Validate profile columns against :data:`GROUP_BY_COLUMNS`."""
    if isinstance(group_by, str):
        group_by = (group_by,)
    bad = [g for g in group_by if g not in GROUP_BY_COLUMNS]
    if bad:
        raise ValueError(f"cannot group by {bad}; choose from {list(GROUP_BY_COLUMNS)}")
    return tuple(group_by)


def check_limit(limit: int) -> int:
    """A page size must be a positive int."""
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    return limit


def check_schema_version(episode_id: str, version: int) -> None:
    """Refuse a stored record written by a newer arborl instead of misreading it."""
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"episode {episode_id} was written with schema_version {version} by a newer arborl; this "
            f"arborl reads schema_version <= {SCHEMA_VERSION}. Upgrade arborl to read this store."
        )
