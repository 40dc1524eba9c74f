"""Configuration of the arborl network proxy (stdlib only; no mitmproxy import).

``ProxyConfig`` is built in arborl's main process, validated here, and handed to the proxy
process as JSON. A TOML file with the same keys maps onto it (``ProxyConfig.from_toml``)::

    mode = "record"
    cache_path = "runs/web-cache.sqlite"
    allow = ["*.wikipedia.org", "api.github.com"]
    deny = ["*.huggingface.co"]
    max_response_body = 8_000_000
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import policy

MODES = ("live", "record", "replay")
# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107


def default_venv() -> Path:
    """Where the proxy's own venv lives: ``$ARBORL_PROXY_VENV`` or ``~/.cache/arborl/proxy-venv``."""
    env = os.environ.get("ARBORL_PROXY_VENV")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "arborl" / "proxy-venv"


def default_confdir() -> Path:
    """Where mitmproxy keeps its CA: one stable place so sandbox images can trust it once."""
    return Path.home() / ".cache" / "arborl" / "proxy-ca"


def _tuple(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ValueError(
            f"{name} must be a list of strings, got the single string {value!r}; write [{value!r}]"
        )
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the proxy process needs; immutable once built."""

    allow: tuple[str, ...] = ()
    """Domain patterns that may be reached: ``example.com``, ``*.example.com`` or ``*``. Empty: none."""
    deny: tuple[str, ...] = ()
    """Domain patterns refused even when allowed (the deny list wins)."""
    mode: str = "live"
    """``live`` (no cache), ``record`` (go upstream, store) or ``replay`` (cache only, no network)."""
    cache_path: str | None = None
    """SQLite file of recorded responses; required for ``record`` and ``replay``."""
    unix_socket: bool = True
    """Listen on a unix socket (the only way in from a sandbox)."""
    socket_path: str | None = None
    """Path of that socket; default ``<state_dir>/proxy.sock``."""
    socket_mode: int = 0o666
    """File mode of the socket; the sandbox uid must be able to write to it to connect."""
    tcp_port: int | None = None
    """Also listen on ``127.0.0.1:tcp_port`` for host processes (0 picks a free port)."""
    allow_private: tuple[str, ...] = ()
    """``host:port`` exceptions to the non-public-address rule, e.g. a test's loopback upstream."""
    resolve: tuple[tuple[str, str], ...] = ()
    """Static ``(host, ip)`` overrides applied before DNS (like ``curl --resolve``); the address
    rule still applies to the IP. A TOML table ``[resolve]`` maps onto it."""
    max_request_body: int = 1 << 20
    """Largest request body forwarded, in bytes; larger gets 413."""
    max_response_body: int = 16 << 20
    """Largest response body passed back or stored, in bytes; larger gets 502."""
    rate_limit_per_s: float | None = None
    """Sustained requests per second over the whole proxy (token bucket); None: unlimited."""
    rate_limit_burst: int = 20
    """Bucket size of that limit."""
    max_requests: int | None = None
    """Total request budget of this proxy's lifetime (e.g. one episode); None: unlimited."""
    cache_key_headers: tuple[str, ...] = ()
    """Further request headers that take part in the cache key (e.g. ``accept``); the credential
    headers (``authorization``, ``proxy-authorization``, ``cookie``) always do, as a digest."""
    https_intercept: bool = True
    """Decrypt HTTPS with the proxy CA so it can be filtered per URL and cached. False tunnels
    CONNECT as opaque bytes (host policy only, no caching; impossible in ``replay``)."""
    upstream_ca: str | None = None
    """PEM bundle of CAs trusted for upstream TLS instead of the system store (e.g. a private CA)."""
    confdir: str | None = None
    """mitmproxy's directory holding its CA; default ``~/.cache/arborl/proxy-ca``."""
    state_dir: str | None = None
    """Directory for the socket, admin socket, log and config file; default a fresh temp dir."""
    venv: str | None = None
    """The proxy venv (has mitmproxy 11.0.2); default ``$ARBORL_PROXY_VENV`` or ``~/.cache/arborl/proxy-venv``."""
    start_timeout_s: float = 30.0
    """How long ``start()`` waits for the proxy to listen."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Free-form labels copied into stats (e.g. the episode id); not interpreted."""

    def __post_init__(self) -> None:
        for name in ("allow", "deny", "allow_private", "cache_key_headers"):
            object.__setattr__(self, name, _tuple(getattr(self, name), name))
        resolve = self.resolve.items() if isinstance(self.resolve, Mapping) else self.resolve
        object.__setattr__(self, "resolve", tuple((str(h), str(ip)) for h, ip in resolve))
        self._validate()

    def _validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode != "live" and not self.cache_path:
            raise ValueError(
                f"mode {self.mode!r} needs cache_path (an SQLite file); set it or use mode='live'"
            )
        if self.mode == "replay" and not self.https_intercept:
            raise ValueError(
                "replay needs https_intercept=True: an opaque CONNECT tunnel cannot be served from cache"
            )
        if not self.unix_socket and self.tcp_port is None:
            raise ValueError("the proxy must listen somewhere: set unix_socket=True and/or tcp_port")
        if self.tcp_port is not None and not 0 <= self.tcp_port < 65536:
            raise ValueError(f"tcp_port must be in 0..65535 (0 picks a free port), got {self.tcp_port}")
        if self.socket_path and len(os.fsencode(self.socket_path)) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"socket_path is {len(os.fsencode(self.socket_path))} bytes; unix socket paths must be at most "
                f"{_MAX_SOCKET_PATH}: choose a shorter path (e.g. under /tmp)"
            )
        for name in ("max_request_body", "max_response_body", "rate_limit_burst"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.rate_limit_per_s is not None and self.rate_limit_per_s <= 0:
            raise ValueError(f"rate_limit_per_s must be positive or None, got {self.rate_limit_per_s}")
        if self.max_requests is not None and self.max_requests <= 0:
            raise ValueError(f"max_requests must be positive or None, got {self.max_requests}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be positive, got {self.start_timeout_s}")
        # Parse every list now so a typo fails here, not inside the proxy process.
        policy.Policy(self.allow, self.deny, self.allow_private)
        for host, ip in self.resolve:
            if policy.ip_literal(ip) is None:
                raise ValueError(f"resolve[{host!r}] must be an IP address, got {ip!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProxyConfig:
        """Build from a mapping (e.g. parsed TOML); unknown keys are an error.

        Args:
            data: Keys are field names.

        Returns:
            The validated config.

        Raises:
            ValueError: On an unknown key or an invalid value.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown proxy config keys {unknown}; valid keys are {sorted(names)}")
        return cls(**dict(data))

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> ProxyConfig:
        """Load a TOML file whose top-level keys are field names (a ``[proxy]`` table also works)."""
        with open(path, "rb") as f:
            data = tomllib.load(f)
        if set(data) == {"proxy"}:
            data = data["proxy"]
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> ProxyConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["resolve"] = [list(p) for p in self.resolve]
        out["extra"] = dict(self.extra)
        return out
