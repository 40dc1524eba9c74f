"""``open_store(url)``: the one place a store URL maps to a backend.

URL forms (see docs/store.md):

* ``sqlite:///relative/or/absolute/path.db`` (``sqlite:////abs/path.db`` also works)
* ``postgresql://user@host:port/db``
* ``redis://host:port/0?blob=...`` (index only; bodies go to the ``blob`` store, required)

Query parameters common to all: ``blob=file:///dir`` or ``blob=s3://bucket/prefix``,
``s3_endpoint=http://host:port`` (S3-compatible server), ``ttl=search:7d,code:12h,*:30d``
(per-task-type retention; ``*`` is the default). SQLite also takes ``synchronous=full``;
PostgreSQL takes ``pool_min``/``pool_max`` and ``partitioned=day|week|month``; Redis takes ``prefix``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlparse, urlunparse

from arborl.store.base import StoreConfig, StoreError
from arborl.store.blob import BlobStore, open_blob_store

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"`` -> timedelta."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise StoreError(f"bad duration {text!r}; write a number and a unit s/m/h/d/w, e.g. 7d")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def parse_ttl(text: str) -> StoreConfig:
    """``"search:7d,code:12h,*:30d"`` -> StoreConfig (``*`` sets the default TTL)."""
    per: dict[str, timedelta] = {}
    default = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, dur = part.rpartition(":")
        if not sep or not name:
            raise StoreError(f"bad ttl entry {part!r}; write task_type:duration, e.g. search:7d")
        if name == "*":
            default = parse_duration(dur)
        else:
            per[name] = parse_duration(dur)
    return StoreConfig(ttl_by_task_type=per, default_ttl=default)


def open_store(url: str, *, config: StoreConfig | None = None, blobs: BlobStore | None = None,
               create: bool = True) -> Any:
    """Open (creating if needed) the trajectory store named by ``url``.

    Args:
        url: Store URL (module docstring lists the forms and parameters).
        config: TTL settings; overrides ``ttl=`` in the URL.
        blobs: A ready blob store; overrides ``blob=`` in the URL.
        create: Create a missing SQLite file (``False``: raise :class:`StoreError` instead).

    Returns:
        A store implementing :class:`~arborl.store.base.TrajectoryStore`.
    """
    u = urlparse(url)
    params = dict(parse_qsl(u.query))
    blob_url = params.pop("blob", None)
    s3_endpoint = params.pop("s3_endpoint", None)
    ttl = params.pop("ttl", None)
    if config is None:
        config = parse_ttl(ttl) if ttl else StoreConfig()
    if blobs is None and blob_url:
        blobs = open_blob_store(blob_url, s3_endpoint=s3_endpoint)
    if u.scheme == "sqlite":
        from arborl.store.sqlite import SQLiteStore

        # As in SQLAlchemy: sqlite:///rel/path.db is relative, sqlite:////abs/path.db absolute.
        path = u.path[1:]
        if u.netloc or not path:
            raise StoreError(f"store URL {url!r} needs a file and no host; write sqlite:///relative/traj.db or sqlite:////absolute/traj.db")
        _no_extra(params, {"synchronous"}, url)
        if not create and not Path(path).exists():
            raise StoreError(f"no store at {path} (from {url!r})")
        return SQLiteStore(path, blobs=blobs, config=config, synchronous=params.get("synchronous", "normal"))
    if u.scheme in ("postgresql", "postgres"):
        from arborl.store.postgres import PostgresStore

        _no_extra(params, {"pool_min", "pool_max", "partitioned"}, url)
        conninfo = urlunparse(u._replace(scheme="postgresql", query=""))
        return PostgresStore(conninfo, blobs=blobs, config=config, partitioned=params.get("partitioned"),
                             pool_min=int(params.get("pool_min", 1)), pool_max=int(params.get("pool_max", 4)))
    if u.scheme == "redis":
        from arborl.store.redis_index import RedisStore

        _no_extra(params, {"prefix"}, url)
        conn = urlunparse(u._replace(query=""))
        return RedisStore(conn, blobs=blobs, config=config, prefix=params.get("prefix", "arborl"))
    raise StoreError(
        f"unsupported store URL {url!r}; use sqlite:///path.db, postgresql://user@host:port/db or "
        "redis://host:port/0 (MongoDB and DynamoDB are not supported: no server can be tested here)"
    )


def _no_extra(params: dict[str, str], allowed: set[str], url: str) -> None:
    extra = set(params) - allowed
    if extra:
        raise StoreError(f"unknown parameter(s) {sorted(extra)} in store URL {url!r}; "
                         f"allowed: blob, s3_endpoint, ttl, {', '.join(sorted(allowed))}")


def redact(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    u = urlparse(url)
    return url.replace(f":{u.password}@", ":***@", 1) if u.password else url
