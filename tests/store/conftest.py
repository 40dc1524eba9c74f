"""Fixtures for store tests: episodes and stores (service-backed stores live in services.py)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from store_services import pg_database  # noqa: E402
from storekit import make_episode  # noqa: E402

BACKENDS = ["sqlite", *(pytest.param(b, marks=pytest.mark.services)
                         for b in ("postgres", "postgres_partitioned", "redis", "redis_s3", "dynamodb"))]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/traj.db"


@pytest.fixture
def aws_env(monkeypatch):
    """Dummy credentials for the moto S3 and DynamoDB emulator (boto3 refuses to sign without some)."""
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path: Path):
    """A URL of an empty store, once per backend."""
    kind = request.param
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/traj.db"
    elif kind.startswith("postgres"):
        url, drop = pg_database(request.getfixturevalue("pg_server"), kind.endswith("partitioned"), tmp_path / "b")
        yield url
        drop()
    elif kind == "dynamodb":
        yield dynamodb_url(request.getfixturevalue("s3_endpoint"), request)
    else:
        server = request.getfixturevalue("redis_url_server")
        prefix = "t" + uuid.uuid4().hex[:12]
        if kind == "redis":
            yield f"{server}?prefix={prefix}&blob=file://{tmp_path}/blobs"
        else:
            endpoint = request.getfixturevalue("s3_endpoint")
            request.getfixturevalue("aws_env")
            yield f"{server}?prefix={prefix}&blob=s3://{prefix}/bodies&s3_endpoint={endpoint}"


def dynamodb_url(endpoint: str, request) -> str:
    """A fresh table on the moto server (which emulates DynamoDB and S3 alike), bodies in its S3."""
    request.getfixturevalue("aws_env")
    table = "t" + uuid.uuid4().hex[:12]
    return f"dynamodb://{table}?endpoint={endpoint}&region=us-east-1&blob=s3://{table}/bodies&s3_endpoint={endpoint}"


@pytest.fixture
def ddb_url(s3_endpoint, request) -> str:
    """A URL of an empty DynamoDB store on the session's moto server."""
    return dynamodb_url(s3_endpoint, request)


@pytest.fixture
def episodes() -> list:
    return [make_episode(i) for i in range(10)]


def _service(factory):
    """Start a service for the session; skip (or fail under ARBORL_REQUIRE_SERVICES=1) if missing."""
    import contextlib
    import os

    from store_services import ServiceMissing

    stack = contextlib.ExitStack()
    try:
        url = stack.enter_context(factory())
    except ServiceMissing as e:
        if os.environ.get("ARBORL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"ARBORL_REQUIRE_SERVICES=1 but {e}")
        pytest.skip(str(e))
    return url, stack


@pytest.fixture(scope="session")
def pg_server():
    from store_services import postgres_server

    url, stack = _service(postgres_server)
    with stack:
        yield url


@pytest.fixture(scope="session")
def redis_url_server():
    from store_services import redis_server

    url, stack = _service(redis_server)
    with stack:
        yield url


@pytest.fixture(scope="session")
def s3_endpoint():
    from store_services import moto_server

    url, stack = _service(moto_server)
    with stack:
        yield url


SECRET = "s3cr3t-Pa55"
"""The password of the password-protected servers below."""


@pytest.fixture(scope="session")
def pg_password_server():
    """A PostgreSQL server that needs the password :data:`SECRET`; its URL carries it."""
    from functools import partial

    from store_services import postgres_server

    url, stack = _service(partial(postgres_server, password=SECRET))
    with stack:
        yield url


@pytest.fixture(scope="session")
def redis_password_server():
    """A Redis server that needs the password :data:`SECRET`; its URL carries it."""
    from functools import partial

    from store_services import redis_server

    url, stack = _service(partial(redis_server, password=SECRET))
    with stack:
        yield url
