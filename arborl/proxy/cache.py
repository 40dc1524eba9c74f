"""Record/replay response cache of the arborl proxy, in SQLite (stdlib only).

Imported by the proxy process (own venv) and by arborl's main process (to inspect a cache), so it
imports only the standard library.

A response is stored under a key derived from everything the upstream sees that can change it:

* the method, upper-cased;
* the URL with only what is case- or default-insensitive normalised: lower-case scheme and host,
  default port dropped, an empty path written ``/``. The request-target after the host (path,
  query, fragment) is kept exactly as sent: no reordering, no unescaping, no re-encoding, since
  ``?a=1&a=2`` and ``?a=2&a=1``, ``?q=%zz`` and ``?q=%25zz``, ``?flag`` and ``?flag=``, ``;`` and
  ``%3B`` are different requests to a server;
* the sha256 of the request body;
* the credentials: the sha256 of the ``Authorization``, ``Proxy-Authorization`` and ``Cookie``
  headers (in the order sent) and of the URL's ``user:password@``. A response recorded under
  credentials is only ever served to a request with the very same credentials, and a response
  recorded without any never to one that has them. Only the digest is kept, never the value;
* the values of an explicit allowlist of other request headers (empty by default: user agents and
  dates would otherwise make every key unique).

``record`` mode overwrites the entry for a key with the newest response; ``replay`` serves it.
Bodies are stored as received (still content-encoded), together with the status, the headers
minus hop-by-hop ones, and the time they were fetched.

A cache file written with an older key (:data:`SCHEMA_VERSION` 1 sorted and unescaped the query
and ignored credentials) is refused when opened: its keys cannot be recomputed from what it
stores, so it must be re-recorded.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMA_VERSION = 2
"""Version of the key and table format; 2: exact request-target and credentials in the key."""
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
"""Request headers that carry credentials: always part of the key, as a digest only."""
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Headers that describe one hop of the connection, not the resource (RFC 9110 section 7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    }
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    method TEXT NOT NULL,
    url TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    status INTEGER NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    fetched REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _split(url: str) -> tuple[str, str, str, str]:
    """``(scheme, userinfo, host[:port], request-target)`` of an absolute URL, target verbatim."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"cache keys need an absolute http(s) URL, got {url!r}")
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    authority, target = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    userinfo, _, hostport = authority.rpartition("@")
    return scheme, userinfo, hostport, target


def normalise_url(url: str) -> str:
    """Canonical form of a URL for cache keys (see the module docstring).

    Args:
        url: An absolute ``http``/``https`` URL.

    Returns:
        The URL with lower-case scheme and host, no default port and no ``user:password@``; the
        path, query and fragment exactly as given.
    """
    scheme, _, hostport, target = _split(url)
    scheme = scheme.lower()
    parts = urlsplit(f"{scheme}://{hostport}")
    host = (parts.hostname or "").lower().rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return f"{scheme}://{netloc}{target if target.startswith('/') else '/' + target}"


def credentials_digest(url: str, headers: Iterable[tuple[str, str]]) -> str:
    """Hex sha256 of a request's credentials (see the module docstring), ``""`` if it has none."""
    creds = [[k.lower(), v] for k, v in headers if k.lower() in CREDENTIAL_HEADERS]
    creds.sort(key=lambda kv: kv[0])  # stable: repeated headers keep the order they were sent in
    userinfo = _split(url)[1]
    if not creds and not userinfo:
        return ""
    return hashlib.sha256(json.dumps([userinfo, creds], separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """What identifies a cached response.

    Attributes:
        method: Upper-case HTTP method.
        url: Normalised URL.
        body_sha256: Hex sha256 of the request body.
        headers: ``(name, value)`` pairs of the allowlisted request headers, sorted by name
            (repeated headers in the order sent).
        credentials: Hex sha256 of the request's credentials, ``""`` for none.
    """

    method: str
    url: str
    body_sha256: str
    headers: tuple[tuple[str, str], ...] = ()
    credentials: str = ""

    @property
    def digest(self) -> str:
        """The hex sha256 that is the table's primary key."""
        blob = json.dumps(
            [self.method, self.url, self.body_sha256, list(self.headers), self.credentials],
            separators=(",", ":"),
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def describe(self) -> str:
        """A one-line human description, used in replay-miss errors."""
        extra = "".join(f" {k}={v!r}" for k, v in self.headers)
        creds = "yes" if self.credentials else "none"
        return (
            f"{self.method} {self.url} body_sha256={self.body_sha256[:16]}{extra} credentials={creds} "
            f"(key {self.digest[:16]})"
        )


def make_key(
    method: str,
    url: str,
    body: bytes,
    headers: Iterable[tuple[str, str]] = (),
    key_headers: Iterable[str] = (),
) -> CacheKey:
    """Build the cache key of a request.

    Args:
        method: HTTP method.
        url: Absolute URL.
        body: Raw request body (empty for none).
        headers: All request headers as ``(name, value)`` pairs.
        key_headers: Names of further headers that take part in the key (case-insensitive);
            credential headers always do, as a digest (:data:`CREDENTIAL_HEADERS`).

    Returns:
        The key.
    """
    headers = list(headers)
    wanted = {h.lower() for h in key_headers} - set(CREDENTIAL_HEADERS)
    picked = sorted(((k.lower(), v) for k, v in headers if k.lower() in wanted), key=lambda kv: kv[0])
    return CacheKey(
        method.upper(),
        normalise_url(url),
        hashlib.sha256(body).hexdigest(),
        tuple(picked),
        credentials_digest(url, headers),
    )


@dataclass(frozen=True)
class CachedResponse:
    """A stored upstream response.

    Attributes:
        status: HTTP status code.
        headers: ``(name, value)`` pairs, hop-by-hop headers removed.
        body: The body as received (content-encoded if the upstream encoded it).
        fetched: Unix time it was fetched.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    fetched: float


class ResponseCache:
    """SQLite table of responses keyed by :class:`CacheKey`.

    Args:
        path: The SQLite file; created (with its table) if missing.
    """

    def __init__(self, path: str):
        self.path = path
        # The proxy runs one event loop thread; WAL lets a reader (tests, a dashboard) look in.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT value FROM meta WHERE name='schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise ValueError(
                f"cache {path!r} has schema version {row[0]}, this arborl reads {SCHEMA_VERSION} (keys on "
                "the exact query and the credentials, docs/proxy.md), so its entries can never match; "
                "re-record it (mode='record') into a new cache file"
            )

    def get(self, key: CacheKey) -> CachedResponse | None:
        """Return the stored response for ``key``, or None on a miss."""
        row = self._db.execute(
            "SELECT status, headers, body, fetched FROM responses WHERE key=?", (key.digest,)
        ).fetchone()
        if row is None:
            return None
        status, headers, body, fetched = row
        return CachedResponse(
            int(status), tuple(tuple(h) for h in json.loads(headers)), bytes(body), float(fetched)
        )

    def put(self, key: CacheKey, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        """Store (or replace) the response for ``key``; hop-by-hop headers are dropped."""
        kept = [[k, v] for k, v in headers if k.lower() not in HOP_BY_HOP]
        self._db.execute(
            "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key.digest, key.method, key.url, key.body_sha256, status, json.dumps(kept), body, time.time()),
        )

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def urls(self) -> list[tuple[str, str, int]]:
        """``(method, url, status)`` of every entry, ordered by URL: for inspecting a recording."""
        return [
            tuple(r)
            for r in self._db.execute("SELECT method, url, status FROM responses ORDER BY url, method")
        ]

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()
