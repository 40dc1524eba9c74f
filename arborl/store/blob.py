"""Content-addressed blob stores for episode bodies and media.

A blob's key is the sha256 of its bytes, laid out as ``sha256/<first two hex>/<hex>`` under a
root. ``put`` returns a URL that is kept in the index row (or in a :class:`MediaRef`); putting
the same bytes twice stores them once. Backends:

* :class:`FileBlobStore` (``file:///dir``): the default. Writes go to a temporary file that is
  fsynced and renamed into place, so a crash never leaves a truncated blob under a final name.
* :class:`S3BlobStore` (``s3://bucket/prefix``): any S3-compatible server through ``boto3``.
  Tested against ``moto_server`` over HTTP only (no real AWS, MinIO or Ceph is reachable
  here), so provider-specific behaviour (eventual consistency, multipart limits) is untested.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

from arborl.store.base import StoreError


def blob_key(digest: str) -> str:
    """Relative key of a blob from its sha256 hex digest."""
    return f"sha256/{digest[:2]}/{digest}"


@runtime_checkable
class BlobStore(Protocol):
    """Bytes by content hash."""

    def put(self, data: bytes) -> str:
        """Store bytes (once per content); return their URL."""
        ...

    def get(self, url: str) -> bytes:
        """Bytes at a URL this store returned; :class:`StoreError` if missing."""
        ...

    def delete(self, url: str) -> None:
        """Remove a blob (missing blobs are ignored)."""
        ...

    def close(self) -> None:
        """Release clients."""
        ...


class FileBlobStore:
    """Blobs as files under a local directory.

    Args:
        root: Directory for blobs (created by the first ``put``, so opening a store to read it
            creates nothing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def _path(self, url: str) -> Path:
        p = Path(urlparse(url).path).resolve() if url.startswith("file://") else Path(url).resolve()
        if self.root not in p.parents:
            raise StoreError(f"blob URL {url!r} is outside this blob store ({self.root})")
        return p

    def put(self, data: bytes) -> str:
        """Write ``data`` atomically under its sha256 key; return ``file://`` URL."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / blob_key(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)  # atomic: readers see the whole blob or none
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return path.as_uri()

    def get(self, url: str) -> bytes:
        """Read a blob."""
        try:
            return self._path(url).read_bytes()
        except FileNotFoundError as e:
            raise StoreError(f"blob {url} is missing from {self.root}") from e

    def delete(self, url: str) -> None:
        """Remove a blob file."""
        self._path(url).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release."""


class S3BlobStore:
    """Blobs as objects in an S3-compatible bucket (created if missing).

    Args:
        bucket: Bucket name.
        prefix: Key prefix inside the bucket.
        endpoint_url: Server URL for S3-compatible services (``None``: AWS).
        client: A ready boto3 S3 client (overrides ``endpoint_url``).
        create: Create the bucket if it is missing (``False``: raise :class:`StoreError`).
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None,
                 client: Any | None = None, create: bool = True) -> None:
        if client is None:
            import boto3  # optional dependency: the `store` extra

            client = boto3.client("s3", endpoint_url=endpoint_url)
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        try:
            self.client.head_bucket(Bucket=bucket)
        except Exception as e:  # noqa: BLE001 - boto raises ClientError subclasses built at runtime
            if not create:
                raise StoreError(f"no bucket s3://{bucket} ({type(e).__name__}); a read-only store creates none") from e
            self.client.create_bucket(Bucket=bucket)

    def _key(self, url: str) -> str:
        u = urlparse(url)
        if u.scheme != "s3" or u.netloc != self.bucket:
            raise StoreError(f"blob URL {url!r} is not in bucket s3://{self.bucket}")
        return u.path.lstrip("/")

    def put(self, data: bytes) -> str:
        """Upload ``data`` under its sha256 key; return ``s3://bucket/key``."""
        key = blob_key(hashlib.sha256(data).hexdigest())
        key = f"{self.prefix}/{key}" if self.prefix else key
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return f"s3://{self.bucket}/{key}"

    def get(self, url: str) -> bytes:
        """Download a blob."""
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(url))["Body"].read()
        except self.client.exceptions.NoSuchKey as e:
            raise StoreError(f"blob {url} is missing") from e

    def delete(self, url: str) -> None:
        """Delete an object."""
        self.client.delete_object(Bucket=self.bucket, Key=self._key(url))

    def close(self) -> None:
        """Close the HTTP pool of the client."""
        self.client.close()


class NoBlobStore:
    """Placeholder for stores opened without ``?blob=``: media calls explain how to configure one."""

    def __init__(self, why: str) -> None:
        self.why = why

    def put(self, data: bytes) -> str:
        """Refuse: no blob store is configured."""
        raise StoreError(self.why)

    def get(self, url: str) -> bytes:
        """Refuse: no blob store is configured."""
        raise StoreError(self.why)

    def delete(self, url: str) -> None:
        """Refuse: no blob store is configured."""
        raise StoreError(self.why)

    def close(self) -> None:
        """Nothing to release."""


def open_blob_store(url: str, s3_endpoint: str | None = None, create: bool = True) -> BlobStore:
    """A blob store from a URL: ``file:///dir`` or ``s3://bucket/prefix`` (``create``: a missing bucket)."""
    u = urlparse(url)
    if u.scheme == "file":
        return FileBlobStore(u.path)
    if u.scheme == "s3":
        if not u.netloc:
            raise StoreError(f"blob URL {url!r} has no bucket; write s3://bucket/prefix")
        return S3BlobStore(u.netloc, u.path, endpoint_url=s3_endpoint, create=create)
    raise StoreError(f"unsupported blob URL {url!r}; use file:///dir or s3://bucket/prefix")
