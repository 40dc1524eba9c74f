"""Replay-cache keys: requests a server can tell apart never share a recorded answer.

Each pair below is two requests that an upstream sees differently (the raw request-target, or
the credentials it carries), so serving one's recorded response to the other is a wrong answer.
The pure tests build the keys; the last test replays through the real proxy process.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from proxy_helpers import Upstream, fetch

from arborl.proxy import ProxyServer
from arborl.proxy.cache import SCHEMA_VERSION, ResponseCache, make_key, normalise_url

BASE = "http://api.test/p"


def _differ(url_a: str, url_b: str) -> bool:
    return make_key("GET", url_a, b"").digest != make_key("GET", url_b, b"").digest


def test_repeated_parameter_order_is_part_of_the_key() -> None:
    assert _differ(f"{BASE}?a=1&a=2", f"{BASE}?a=2&a=1")


def test_invalid_escape_is_not_its_escaped_form() -> None:
    assert _differ(f"{BASE}?q=%zz", f"{BASE}?q=%25zz")


def test_bare_flag_is_not_an_empty_value() -> None:
    assert _differ(f"{BASE}?flag", f"{BASE}?flag=")


def test_semicolon_is_not_its_escape() -> None:
    assert _differ(f"{BASE}?a=1;b=2", f"{BASE}?a=1%3Bb=2")


def test_query_is_kept_exactly_as_sent() -> None:
    # Only scheme, host and default port are normalised; the request-target stays byte for byte.
    assert normalise_url("HTTP://Api.TEST:80/a%7e?b=2&a=1&a=%zz;x") == "http://api.test/a%7e?b=2&a=1&a=%zz;x"
    assert normalise_url("https://api.test:443") == "https://api.test/"
    assert normalise_url("https://api.test:8443/x?") == "https://api.test:8443/x?"
    assert _differ(f"{BASE}?b=2&a=1", f"{BASE}?a=1&b=2")  # a server may read its query in order


def test_authorization_is_part_of_the_key() -> None:
    bare = make_key("GET", BASE, b"")
    alice = make_key("GET", BASE, b"", [("Authorization", "Bearer alice")])
    bob = make_key("GET", BASE, b"", [("authorization", "Bearer bob")])
    again = make_key("GET", BASE, b"", [("AUTHORIZATION", "Bearer alice")])
    assert len({bare.digest, alice.digest, bob.digest}) == 3
    assert again.digest == alice.digest  # header names are case-insensitive, values are not


def test_cookies_and_url_userinfo_are_credentials() -> None:
    bare = make_key("GET", BASE, b"").digest
    assert make_key("GET", BASE, b"", [("Cookie", "session=1")]).digest != bare
    assert make_key("GET", "http://user:pw@api.test/p", b"").digest != bare


def test_credentials_never_appear_in_the_key_description() -> None:
    key = make_key("GET", "http://user:pw@api.test/p", b"", [("Authorization", "Bearer s3cret")])
    text = key.describe()
    assert "s3cret" not in text and "pw" not in text and "credentials=" in text


def test_response_recorded_with_authorization_is_not_served_without_it(tmp_path: Path) -> None:
    cache = ResponseCache(str(tmp_path / "c.sqlite"))
    cache.put(make_key("GET", BASE, b"", [("Authorization", "Bearer alice")]), 200, [], b"alice's data")
    assert cache.get(make_key("GET", BASE, b"")) is None
    assert cache.get(make_key("GET", BASE, b"", [("Authorization", "Bearer bob")])) is None
    hit = cache.get(make_key("GET", BASE, b"", [("Authorization", "Bearer alice")]))
    assert hit is not None and hit.body == b"alice's data"
    cache.close()


def test_cache_recorded_with_the_old_key_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    ResponseCache(str(path)).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value='1' WHERE name='schema_version'")
    db.close()
    with pytest.raises(ValueError, match=r"schema version 1.*re-record") as err:
        ResponseCache(str(path))
    assert str(SCHEMA_VERSION) in str(err.value)


def test_replay_serves_neither_a_reordered_query_nor_an_unauthorised_request(
    start_proxy: Callable[..., ProxyServer], upstream: Upstream, tmp_path: Path
) -> None:
    port = upstream.server_address[1]
    reach = {"resolve": {"api.test": "127.0.0.1"}, "allow_private": (f"api.test:{port}",)}
    cache = str(tmp_path / "web.sqlite")
    base = f"http://api.test:{port}"
    recorder = start_proxy(allow=("api.test",), mode="record", cache_path=cache, tcp_port=0, **reach)
    assert fetch(recorder.url, f"{base}/q?a=1&a=2").status == 200
    secret = fetch(recorder.url, f"{base}/me", headers={"Authorization": "Bearer alice"})
    assert secret.status == 200
    recorder.stop()
    replayer = start_proxy(allow=("api.test",), mode="replay", cache_path=cache, tcp_port=0, **reach)
    assert fetch(replayer.url, f"{base}/q?a=1&a=2").headers["x-arborl-proxy"] == "cache-hit"
    assert fetch(replayer.url, f"{base}/q?a=2&a=1").status == 504
    assert fetch(replayer.url, f"{base}/me").status == 504
    again = fetch(replayer.url, f"{base}/me", headers={"Authorization": "Bearer alice"})
    assert (again.status, again.body) == (200, secret.body)
    assert upstream.hits == 2
