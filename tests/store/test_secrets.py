"""Passwords never reach an error message (issue 10, item 10): bad URLs, wrong passwords and
unreachable servers are one-line StoreErrors with the password shown as ***, raised at once (not
after a 30 s pool timeout), and `arborl store` prints them as one line with exit status 2."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import SECRET
from storekit import make_episode

from arborl.store import StoreError, open_store
from arborl.store.url import redact

pytestmark = pytest.mark.services


def _refused(url: str, match: str) -> str:
    t = time.perf_counter()
    with pytest.raises(StoreError, match=match) as e:
        open_store(url)
    msg = str(e.value)
    assert time.perf_counter() - t < 15, "the error must come at once, not after the pool's timeout"
    assert SECRET not in msg and "\n" not in msg, msg
    return msg


def test_postgres_unknown_parameter_and_wrong_password_hide_the_password(pg_password_server):
    msg = _refused(f"{pg_password_server}?bogus=1", "unknown parameter")
    assert ":***@" in msg
    wrong = pg_password_server.replace(SECRET, "Wr0ng-" + SECRET)  # holds the real one as a substring too
    msg = _refused(wrong, "cannot open the PostgreSQL store at postgresql://")
    assert "password authentication failed" in msg and "Wr0ng" not in msg
    with open_store(pg_password_server + "?blob=file:///nonexistent") as store:  # the right one works
        assert store.put_many([make_episode(1)]) == ["ep000001"]


def test_postgres_unreachable_server_is_one_line(pg_password_server):
    host = pg_password_server.rsplit("@", 1)[1].split("/")[0]
    msg = _refused(pg_password_server.replace(host, "127.0.0.1:1"), "cannot open the PostgreSQL store")
    assert ":***@127.0.0.1:1" in msg


def test_redis_unknown_parameter_and_wrong_password_hide_the_password(redis_password_server, tmp_path):
    msg = _refused(f"{redis_password_server}?bogus=1&blob=file://{tmp_path}", "unknown parameter")
    assert ":***@" in msg
    wrong = redis_password_server.replace(SECRET, "Wr0ng-" + SECRET)
    msg = _refused(f"{wrong}?blob=file://{tmp_path}", "cannot open the Redis store at redis://:\\*\\*\\*@")
    assert "Wr0ng" not in msg
    with open_store(f"{redis_password_server}?blob=file://{tmp_path}&prefix=p1") as store:
        assert store.put_many([make_episode(1)]) == ["ep000001"]


def test_cli_wrong_password_is_one_redacted_line_with_exit_2(pg_password_server):
    wrong = pg_password_server.replace(SECRET, "Wr0ng-" + SECRET)
    r = subprocess.run([sys.executable, "-m", "arborl.store.cli", "query", wrong], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert SECRET not in r.stderr and "Wr0ng" not in r.stderr and "password authentication failed" in r.stderr


def test_redact_hides_every_url_password_in_a_message():
    text = "a postgresql://u:p%40ss@h/db and redis://:pw@h:6379/0 and s3://bucket/key, file:///x"
    assert redact(text) == "a postgresql://u:***@h/db and redis://:***@h:6379/0 and s3://bucket/key, file:///x"
