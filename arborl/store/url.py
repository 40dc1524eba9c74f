"""``open_store(url)``: the one place a store URL maps to a backend.

URL forms (see docs/store.md):

* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (four slashes)
* ``postgresql://user@host:port/db``
* ``redis://host:port/0?blob=...`` (index only; bodies go to the ``blob`` store, required)
* ``dynamodb://TABLE?blob=s3://bucket/prefix`` (index only, like Redis), with ``endpoint=`` (a
  DynamoDB-compatible server) and ``region=``; credentials come from boto3's chain, never the URL

Query parameters common to all: ``blob=file:///dir`` or ``blob=s3://bucket/prefix``,
``s3_endpoint=http://host:port`` (S3-compatible server), ``ttl=search:7d,code:12h,*:30d``
(per-task-type retention; ``*`` is the default). SQLite also takes ``synchronous=full``;
PostgreSQL takes ``pool_min``/``pool_max`` and ``partitioned=day|week|month``; Redis takes ``prefix``;
DynamoDB takes ``endpoint`` and ``region``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse, urlunparse

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
               create: bool = True, read_only: bool = False) -> Any:
    """Open (creating if needed) the trajectory store named by ``url``.

    Nothing is written into a file, database or keyspace that is not an arborl store: such a
    target is refused with a :class:`StoreError` naming it, on every backend.

    Args:
        url: Store URL (module docstring lists the forms and parameters).
        config: TTL settings; overrides ``ttl=`` in the URL.
        blobs: A ready blob store; overrides ``blob=`` in the URL.
        create: Create the store if it does not exist (``False``: raise :class:`StoreError` instead).
        read_only: Open for reading only (implies ``create=False``): nothing is created or changed,
            not even a missing blob folder or bucket, and a write raises :class:`StoreError`.

    Returns:
        A store implementing :class:`~arborl.store.base.TrajectoryStore`.

    Raises:
        StoreError: a bad URL, a target that is not an arborl store, a server that cannot be
            reached or refuses the credentials; one line, with any password replaced by ``***``.
    """
    create = create and not read_only
    try:
        return _open(url, config, blobs, create, read_only)
    except StoreError as e:
        raise StoreError(redact(str(e))) from e.__cause__
    except ValueError as e:  # a URL urlparse, int() or a driver cannot read
        raise StoreError(f"bad store URL {redact(url)!r}: {redact(str(e))}") from None


def _open(url: str, config: StoreConfig | None, blobs: BlobStore | None, create: bool, read_only: bool) -> Any:
    u = urlparse(url)
    params = dict(parse_qsl(u.query))
    blob_url = params.pop("blob", None)
    s3_endpoint = params.pop("s3_endpoint", None)
    ttl = params.pop("ttl", None)
    if u.scheme not in ("sqlite", "postgresql", "postgres", "redis", "dynamodb"):
        raise StoreError(
            f"unsupported store URL {redact(url)!r}; use sqlite:///path.db, postgresql://user@host:port/db, "
            "redis://host:port/0 or dynamodb://TABLE (MongoDB is not supported: no server can be tested here)")
    if config is None:
        config = parse_ttl(ttl) if ttl else StoreConfig()
    if blobs is None and blob_url:
        blobs = open_blob_store(blob_url, s3_endpoint=s3_endpoint, create=not read_only)
    if u.scheme == "sqlite":
        from arborl.store.sqlite import SQLiteStore

        _no_extra(params, {"synchronous"}, url)
        path = sqlite_path(url)
        return SQLiteStore(path, blobs=blobs, config=config, synchronous=params.get("synchronous", "normal"),
                           create=create, read_only=read_only)
    if u.scheme in ("postgresql", "postgres"):
        from arborl.store.postgres import PostgresStore

        _no_extra(params, {"pool_min", "pool_max", "partitioned"}, url)
        conninfo = urlunparse(u._replace(scheme="postgresql", query=""))
        return PostgresStore(conninfo, blobs=blobs, config=config, partitioned=params.get("partitioned"),
                             pool_min=_int_param(params, "pool_min", 1), pool_max=_int_param(params, "pool_max", 4),
                             create=create, read_only=read_only)
    if u.scheme == "dynamodb":
        return _open_dynamodb(u, params, url, blobs, config, create, read_only)
    from arborl.store.redis_index import RedisStore

    _no_extra(params, {"prefix"}, url)
    conn = urlunparse(u._replace(query=""))
    return RedisStore(conn, blobs=blobs, config=config, prefix=params.get("prefix", "arborl"), create=create,
                      read_only=read_only)


def _open_dynamodb(u: Any, params: dict[str, str], url: str, blobs: BlobStore | None, config: StoreConfig,
                   create: bool, read_only: bool) -> Any:
    from arborl.store.dynamodb import DynamoDBStore

    _no_extra(params, {"endpoint", "region"}, url)
    if u.path not in ("", "/") or not re.fullmatch(r"[A-Za-z0-9_.-]{3,255}", u.netloc):
        raise StoreError(f"store URL {redact(url)!r} needs one table name of 3-255 letters, digits, '_', '-' or '.' "
                         "and no user, password or path: write dynamodb://TABLE?endpoint=...&region=... "
                         "(credentials come from the AWS environment or config files)")
    return DynamoDBStore(u.netloc, blobs=blobs, config=config, endpoint=params.get("endpoint"),
                         region=params.get("region"), create=create, read_only=read_only)


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///`` URL; a relative path whose directory is missing gets a hint.

    As in SQLAlchemy, ``sqlite:///rel/path.db`` is relative and ``sqlite:////abs/path.db``
    absolute. ``sqlite:///tmp/x.db`` thus names ``./tmp/x.db``: when there is no ``./tmp`` but
    there is a ``/tmp``, the URL is refused with both spellings instead of creating ``./tmp``.
    """
    u = urlparse(url)
    path = u.path[1:]
    if u.netloc or not path:
        raise StoreError(f"store URL {redact(url)!r} needs a file and no host; write sqlite:///relative/traj.db or "
                         "sqlite:////absolute/traj.db")
    p = Path(path)
    if not p.is_absolute() and not p.parent.exists() and Path("/", p.parent).is_dir():
        raise StoreError(f"store URL {url!r} names the relative path {path} (there is no directory {p.parent} here); "
                         f"for /{path} write sqlite:////{path} (four slashes), or create {p.parent}/ first")
    return path


def _int_param(params: dict[str, str], name: str, default: int) -> int:
    try:
        return int(params.get(name, default))
    except ValueError:
        raise StoreError(f"store URL parameter {name}={params[name]!r} is not an integer") from None


def _no_extra(params: dict[str, str], allowed: set[str], url: str) -> None:
    extra = set(params) - allowed
    if extra:
        raise StoreError(f"unknown parameter(s) {sorted(extra)} in store URL {redact(url)!r}; "
                         f"allowed: blob, s3_endpoint, ttl, {', '.join(sorted(allowed))}")


_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@")


def redact(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every URL password replaced by ``***``.

    ``postgresql://user:secret@host/db`` becomes ``postgresql://user:***@host/db``; use it on
    every URL and every message that may hold one before it is printed or logged.
    """
    return _USERINFO.sub(r"\1***@", text)


def redact_secret(text: str, url: str) -> str:
    """:func:`redact`, and any copy of ``url``'s password elsewhere in ``text`` (e.g. a driver's message)."""
    text = redact(text)
    try:
        pw = urlparse(url).password
    except ValueError:
        return text
    if pw:
        for form in {pw, unquote(pw)}:
            text = text.replace(form, "***")
    return text


def one_line(e: BaseException) -> str:
    """A driver error's message on one line (drivers put DETAIL and HINT on lines of their own)."""
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
