"""Trajectory store: persist episodes, query them by index, slice them by turn, export them.

Open a store by URL and use the :class:`~arborl.store.base.TrajectoryStore` methods::

    from arborl.store import open_store
    with open_store("sqlite:///runs/traj.db") as store:
        ids = store.put_many(episodes)
        page = store.query(task_type="search", min_reward=0.5, limit=100)

Backends: SQLite (embedded default), PostgreSQL, Redis (hot index with bodies in a blob
store). Blob stores: local files (default) and S3-compatible servers. See docs/store.md.
"""

from arborl.store.base import (
    EpisodeNotFound,
    Filters,
    IndexRow,
    Page,
    ProfileRow,
    StoreConfig,
    StoreError,
    TrajectoryStore,
)
from arborl.store.url import open_store, parse_ttl

__all__ = [
    "EpisodeNotFound",
    "Filters",
    "IndexRow",
    "Page",
    "ProfileRow",
    "StoreConfig",
    "StoreError",
    "TrajectoryStore",
    "open_store",
    "parse_ttl",
]
