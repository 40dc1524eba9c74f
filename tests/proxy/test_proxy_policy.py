"""Pure tests of the proxy's policy, cache key and config (no proxy process, no mitmproxy)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from arborl.proxy import ProxyConfig
from arborl.proxy.cache import ResponseCache, make_key, normalise_url
from arborl.proxy.policy import (
    Policy,
    authority_host,
    blocked_reason,
    host_matches,
    parse_host_port,
    validate_pattern,
)


@pytest.mark.parametrize(
    ("host", "pattern", "expected"),
    [
        ("example.com", "example.com", True),
        ("EXAMPLE.com.", "example.com", True),  # case and trailing dot ignored
        ("www.example.com", "example.com", False),  # exact means exact
        ("www.example.com", "*.example.com", True),
        ("a.b.example.com", "*.example.com", True),
        ("example.com", "*.example.com", False),  # the apex needs its own entry
        ("evilexample.com", "*.example.com", False),
        ("example.com.evil.org", "*.example.com", False),
        ("anything.at.all", "*", True),
    ],
)
def test_host_matches(host: str, pattern: str, expected: bool) -> None:
    assert host_matches(host, validate_pattern(pattern)) is expected


@pytest.mark.parametrize("bad", ["*example.com", "ex*ample.com", "*.", "", "http://example.com/"])
def test_bad_patterns_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="bad domain pattern"):
        validate_pattern(bad)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "cloud metadata address"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "cloud metadata address"),
        ("fd12:3456::1", "private"),  # unique-local fc00::/7
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "not globally routable"),  # shared address space (CGNAT)
        ("::ffff:10.0.0.1", "embeds 10.0.0.1 (private)"),
        ("64:ff9b::7f00:1", "embeds 127.0.0.1 (loopback)"),  # NAT64 of loopback
        ("2002:a00:1::", "embeds 10.0.0.1 (private)"),  # 6to4 of 10.0.0.1
        ("8.8.8.8", None),
        ("172.32.0.1", None),  # just outside 172.16/12
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
    ],
)
def test_blocked_reason(address: str, reason: str | None) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) == reason


def test_policy_deny_wins_and_private_exceptions_are_exact() -> None:
    policy = Policy(
        allow=["*.test", "api.example.com"], deny=["secret.test"], allow_private=["api.test:8080"]
    )
    assert policy.check_host("a.test").allowed
    assert policy.check_host("API.example.com").allowed
    refused = policy.check_host("secret.test")
    assert not refused.allowed and "deny pattern 'secret.test'" in refused.reason
    assert "not in the allow list" in policy.check_host("example.com").reason
    loopback = [ipaddress.ip_address("127.0.0.1")]
    assert policy.check_addresses("api.test", 8080, loopback).allowed
    assert not policy.check_addresses("api.test", 8081, loopback).allowed  # other port
    assert not policy.check_addresses("b.test", 8080, loopback).allowed  # other name
    # One private address among public ones is enough to refuse (rebinding with mixed answers).
    mixed = [ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("10.0.0.1")]
    assert "10.0.0.1 (private)" in policy.check_addresses("b.test", 80, mixed).reason
    assert not Policy(allow=[]).check_host("example.com").allowed  # empty allow list: nothing


def test_parse_host_port() -> None:
    assert parse_host_port("LocalHost:8080") == ("localhost", 8080)
    assert parse_host_port("[::1]:443") == ("::1", 443)
    for bad in ("localhost", "::1:80", "host:0", "host:http"):
        with pytest.raises(ValueError):
            parse_host_port(bad)


def test_authority_host() -> None:
    assert authority_host("Example.com") == "example.com"
    assert authority_host("example.com:8080") == "example.com"
    assert authority_host("[::1]:443") == "::1"
    assert authority_host("[::1]") == "::1"


def test_normalise_url_and_key() -> None:
    # Scheme, host and default port are normalised; the request-target is kept as sent.
    assert normalise_url("HTTP://Example.COM:80/a?b=2&a=1&a=0") == "http://example.com/a?b=2&a=1&a=0"
    assert normalise_url("https://example.com:443") == "https://example.com/"
    assert normalise_url("http://[::1]:8080/") == "http://[::1]:8080/"
    a = make_key("get", "http://h/p?y=1&x=2", b"")
    b = make_key("GET", "http://H:80/p?y=1&x=2", b"")
    assert a.digest == b.digest
    assert make_key("POST", "http://h/p", b"1").digest != make_key("POST", "http://h/p", b"2").digest
    # Only allowlisted headers take part, case-insensitively.
    h1 = make_key("GET", "http://h/", b"", [("Accept", "json"), ("User-Agent", "a")], key_headers=["accept"])
    h2 = make_key("GET", "http://h/", b"", [("accept", "json"), ("User-Agent", "b")], key_headers=["Accept"])
    h3 = make_key("GET", "http://h/", b"", [("accept", "html")], key_headers=["accept"])
    assert h1.digest == h2.digest != h3.digest


def test_cache_roundtrip_drops_hop_by_hop_headers(tmp_path: Path) -> None:
    cache = ResponseCache(str(tmp_path / "c.sqlite"))
    key = make_key("GET", "http://h/p", b"")
    assert cache.get(key) is None
    headers = [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked"), ("Set-Cookie", "a=1")]
    cache.put(key, 404, headers, b"\x00body")
    hit = cache.get(key)
    assert hit is not None
    assert (hit.status, hit.body) == (404, b"\x00body")
    assert hit.headers == (("Content-Type", "text/plain"), ("Set-Cookie", "a=1"))
    cache.put(key, 200, [], b"newer")  # record overwrites
    assert len(cache) == 1 and cache.get(key).body == b"newer"  # type: ignore[union-attr]
    assert cache.urls() == [("GET", "http://h/p", 200)]
    cache.close()


def test_config_validation_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        ProxyConfig(mode="offline")
    with pytest.raises(ValueError, match="needs cache_path"):
        ProxyConfig(mode="replay")
    with pytest.raises(ValueError, match="bad domain pattern"):
        ProxyConfig(allow=("*example.com",))
    with pytest.raises(ValueError, match="list of strings"):
        ProxyConfig(allow="example.com")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad host:port"):
        ProxyConfig(allow_private=("localhost",))
    with pytest.raises(ValueError, match="at most 107"):
        ProxyConfig(socket_path="/tmp/" + "s" * 120)
    with pytest.raises(ValueError, match="must be an IP address"):
        ProxyConfig(resolve={"a.test": "not-an-ip"})
    with pytest.raises(ValueError, match="listen somewhere"):
        ProxyConfig(unix_socket=False)
    with pytest.raises(ValueError, match="unknown proxy config keys"):
        ProxyConfig.from_dict({"alow": ["x"]})


def test_config_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(
        'mode = "record"\ncache_path = "web.sqlite"\nallow = ["*.wikipedia.org"]\n'
        'max_response_body = 1000\n[resolve]\n"a.test" = "127.0.0.1"\n'
    )
    cfg = ProxyConfig.from_toml(path)
    assert cfg.allow == ("*.wikipedia.org",)
    assert cfg.resolve == (("a.test", "127.0.0.1"),)
    assert cfg.to_dict()["resolve"] == [["a.test", "127.0.0.1"]]
    assert ProxyConfig.from_dict(cfg.to_dict()) == cfg  # round-trips through JSON-ready dicts
