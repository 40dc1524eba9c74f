"""The mitmproxy addon that enforces arborl's network policy and record/replay cache.

Runs only inside the proxy process, in the proxy's own venv (mitmproxy 11.0.2); arborl's main
process never imports it. Besides mitmproxy it imports only the stdlib and the sibling modules
``policy`` and ``cache``, which are themselves stdlib-only.

Hooks, in the order mitmproxy calls them:

* ``http_connect``: a CONNECT to a refused host gets 403 before any upstream connection.
* ``requestheaders``: domain lists, rate limit, declared request size, and (unless replaying)
  the resolved-address rule, so a refusal is a 403 that says why.
* ``request``: actual request size; in ``replay`` the response comes from the cache, and a miss
  is a 504 naming the missing key.
* ``server_connect``: the last gate before a socket to upstream is opened: host and addresses
  are checked again (with a readable error). In ``replay`` every connection is refused here.
* the resolver guard (``install_resolver_guard``): the event loop's ``getaddrinfo``, which
  mitmproxy's connect uses, only ever returns addresses that pass the rule. So the address
  connected to is the address checked, and DNS rebinding between the checks above and the
  connect cannot reach a private address.
* ``server_connected``: defence in depth; the peer address actually connected to is checked.
* ``response``: response size; in ``record`` the response is stored.

What this does not isolate: bandwidth and connection counts beyond the request rate limit, and
the content of allowed sites (an allowed host can return anything, including a redirect to a
refused one; the client then asks the proxy for that URL and is refused).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy import server_hooks

from . import cache as cache_mod
from . import policy as policy_mod

_TEXT = "text/plain; charset=utf-8"
COUNTERS = (
    "requests",  # HTTP requests seen (inside intercepted HTTPS too)
    "connects",  # CONNECT requests seen
    "refused_policy",  # domain allow/deny refusals
    "refused_address",  # non-public destination refusals (SSRF, rebinding)
    "refused_rate",  # rate limit or request budget
    "too_large",  # request or response body over its cap
    "cache_hits",
    "cache_misses",  # replay misses (504)
    "recorded",
    "upstream_connections",  # TCP connections actually opened to upstream servers
    "upstream_blocked",  # connections refused in server_connect
    "errors",
)


class TokenBucket:
    """Requests per second with a burst, over the whole proxy (one proxy per episode or worker)."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.capacity = rate, float(burst)
        self.tokens, self.stamp = float(burst), time.monotonic()

    def take(self) -> bool:
        """Spend one token if available."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class Settings:
    """The subset of ``ProxyConfig`` the addon reads, parsed from the config JSON."""

    policy: policy_mod.Policy
    mode: str
    cache_path: str | None
    resolve: dict[str, str]
    max_request_body: int
    max_response_body: int
    rate_limit_per_s: float | None
    rate_limit_burst: int
    max_requests: int | None
    cache_key_headers: tuple[str, ...]
    https_intercept: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Settings:
        """Build from the dict written by ``ProxyConfig.to_dict``."""
        return cls(
            policy=policy_mod.Policy(cfg["allow"], cfg["deny"], cfg["allow_private"]),
            mode=cfg["mode"],
            cache_path=cfg["cache_path"],
            resolve={policy_mod.normalise_host(h): ip for h, ip in cfg["resolve"]},
            max_request_body=int(cfg["max_request_body"]),
            max_response_body=int(cfg["max_response_body"]),
            rate_limit_per_s=cfg["rate_limit_per_s"],
            rate_limit_burst=int(cfg["rate_limit_burst"]),
            max_requests=cfg["max_requests"],
            cache_key_headers=tuple(cfg["cache_key_headers"]),
            https_intercept=bool(cfg["https_intercept"]),
            extra=dict(cfg.get("extra") or {}),
        )


def _text_response(status: int, reason: str, tag: str) -> http.Response:
    return http.Response.make(
        status, f"arborl proxy: {reason}\n".encode(), {"Content-Type": _TEXT, "X-Arborl-Proxy": tag}
    )


class ArborlAddon:
    """Policy, caps, rate limit and cache as mitmproxy hooks (see the module docstring).

    Args:
        settings: Parsed configuration.
    """

    def __init__(self, settings: Settings):
        self.s = settings
        self.cache = cache_mod.ResponseCache(settings.cache_path) if settings.mode != "live" else None
        self.bucket = (
            TokenBucket(settings.rate_limit_per_s, settings.rate_limit_burst)
            if settings.rate_limit_per_s
            else None
        )
        self.stats: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._spent = 0  # requests charged to max_requests (a CONNECT is charged only if opaque)
        # Unfiltered resolver, set by install_resolver_guard (the loop's own until then).
        self._raw_getaddrinfo: Any = None

    # -- helpers ---------------------------------------------------------------------------------

    def _refuse(self, flow: http.HTTPFlow, status: int, reason: str, counter: str) -> None:
        self.stats[counter] += 1
        flow.metadata["arborl_generated"] = True
        flow.response = _text_response(status, reason, "refused")

    async def _addresses(self, host: str, port: int) -> tuple[list[policy_mod.IPAddress], str]:
        """Resolve ``host`` (static overrides first); returns the addresses or an error message."""
        literal = policy_mod.ip_literal(host)
        if literal is not None:
            return [literal], ""
        override = self.s.resolve.get(policy_mod.normalise_host(host))
        if override is not None:
            return [ipaddress.ip_address(override)], ""
        try:
            resolver = self._raw_getaddrinfo or asyncio.get_running_loop().getaddrinfo
            infos = await resolver(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return [], f"cannot resolve {host!r}: {exc}"
        seen: dict[str, policy_mod.IPAddress] = {}
        for info in infos:
            addr = str(info[4][0]).split("%", 1)[0]  # drop an IPv6 zone id
            seen.setdefault(addr, ipaddress.ip_address(addr))
        return list(seen.values()), ""

    async def _check_destination(self, host: str, port: int) -> tuple[policy_mod.Decision, list[Any]]:
        addrs, err = await self._addresses(host, port)
        if err:
            return policy_mod.Decision(False, err), []
        return self.s.policy.check_addresses(host, port, addrs), addrs

    def _take_budget(self) -> str:
        """Charge one request to the budget and the rate limit; returns a refusal reason or ''."""
        if self.s.max_requests is not None and self._spent >= self.s.max_requests:
            return f"request budget of {self.s.max_requests} exhausted"
        if self.bucket is not None and not self.bucket.take():
            return f"rate limit of {self.s.rate_limit_per_s}/s (burst {self.s.rate_limit_burst}) exceeded"
        self._spent += 1
        return ""

    # -- hooks -----------------------------------------------------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        """Refuse CONNECT to a blocked host before any upstream connection is made."""
        self.stats["connects"] += 1
        host, port = flow.request.host, flow.request.port
        decision = self.s.policy.check_host(host)
        if not decision.allowed:
            return self._refuse(flow, 403, decision.reason, "refused_policy")
        if not self.s.https_intercept and (reason := self._take_budget()):
            return self._refuse(flow, 429, reason, "refused_rate")
        if self.s.mode == "replay":
            literal = policy_mod.ip_literal(host)
            if literal is not None:
                decision = self.s.policy.check_addresses(host, port, [literal])
        else:
            decision, _ = await self._check_destination(host, port)
        if not decision.allowed:
            self._refuse(flow, 403, decision.reason, "refused_address")

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Domain lists, budget, declared size and destination address, before the body is read."""
        self.stats["requests"] += 1
        req = flow.request
        decision = self.s.policy.check_host(req.host)
        if not decision.allowed:
            return self._refuse(flow, 403, decision.reason, "refused_policy")
        # The upstream server routes by Host, not by where we connect: a mismatch would let an
        # allowed front (e.g. a CDN) serve a refused site ("domain fronting").
        stated = req.host_header
        if stated and policy_mod.authority_host(stated) != policy_mod.normalise_host(req.host):
            reason = f"Host header {stated!r} does not match the request's host {req.host!r}"
            return self._refuse(flow, 403, reason, "refused_policy")
        if reason := self._take_budget():
            return self._refuse(flow, 429, reason, "refused_rate")
        declared = req.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.s.max_request_body:
            reason = f"request body of {declared} bytes exceeds the cap of {self.s.max_request_body}"
            return self._refuse(flow, 413, reason, "too_large")
        if self.s.mode == "replay":
            return None  # no DNS and no upstream in replay; server_connect refuses any attempt
        decision, _ = await self._check_destination(req.host, req.port)
        if not decision.allowed:
            self._refuse(flow, 403, decision.reason, "refused_address")
        return None

    def request(self, flow: http.HTTPFlow) -> None:
        """Body cap on the actual body; serve from cache in replay mode."""
        if flow.response is not None:
            return
        body = flow.request.raw_content or b""
        if len(body) > self.s.max_request_body:
            reason = f"request body of {len(body)} bytes exceeds the cap of {self.s.max_request_body}"
            return self._refuse(flow, 413, reason, "too_large")
        if self.cache is None:
            return
        key = cache_mod.make_key(
            flow.request.method,
            flow.request.url,
            body,
            flow.request.headers.items(multi=True),
            self.s.cache_key_headers,
        )
        flow.metadata["arborl_key"] = key
        if self.s.mode == "replay":
            self._serve_cached(flow, key)

    def _serve_cached(self, flow: http.HTTPFlow, key: cache_mod.CacheKey) -> None:
        """Answer from the cache, or with an explicit 504 that names the missing key."""
        assert self.cache is not None
        hit = self.cache.get(key)
        flow.metadata["arborl_generated"] = True
        if hit is None:
            self.stats["cache_misses"] += 1
            reason = f"replay mode and no recorded response for {key.describe()}"
            flow.response = _text_response(504, reason, "cache-miss")
            return
        self.stats["cache_hits"] += 1
        headers = http.Headers([(k.encode("latin-1"), v.encode("latin-1")) for k, v in hit.headers])
        if flow.request.method != "HEAD":  # a HEAD reply keeps the length of the body it omits
            headers["content-length"] = str(len(hit.body))
        headers["x-arborl-proxy"] = "cache-hit"
        headers["x-arborl-fetched"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(hit.fetched))
        now = time.time()
        flow.response = http.Response(
            http_version=b"HTTP/1.1",
            status_code=hit.status,
            reason=status_codes.RESPONSES.get(hit.status, "").encode(),
            headers=headers,
            content=hit.body,
            trailers=None,
            timestamp_start=now,
            timestamp_end=now,
        )

    def response(self, flow: http.HTTPFlow) -> None:
        """Body cap on upstream responses; store them in record mode."""
        if flow.metadata.get("arborl_generated") or flow.response is None:
            return
        body = flow.response.raw_content or b""
        if len(body) > self.s.max_response_body:
            reason = f"response body of {len(body)} bytes exceeds the cap of {self.s.max_response_body}"
            return self._refuse(flow, 502, reason, "too_large")
        key = flow.metadata.get("arborl_key")
        if self.s.mode == "record" and self.cache is not None and key is not None:
            fields = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in flow.response.headers.fields]
            self.cache.put(key, flow.response.status_code, fields, body)
            self.stats["recorded"] += 1

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Check the upstream host and its addresses before connecting; refuse all in replay mode."""
        if data.server.address is None:
            return
        host, port = data.server.address
        if self.s.mode == "replay":
            self.stats["upstream_blocked"] += 1
            data.server.error = "arborl proxy: replay mode makes no upstream connections"
            return
        decision = self.s.policy.check_host(host)
        if decision.allowed:
            decision, _ = await self._check_destination(host, port)
        if not decision.allowed:
            self.stats["upstream_blocked"] += 1
            data.server.error = f"arborl proxy: {decision.reason}"

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Count real upstream connections; re-check the peer actually reached (defence in depth)."""
        self.stats["upstream_connections"] += 1
        peer = data.server.peername
        if not peer or data.server.address is None:
            return
        ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
        if not self.s.policy.check_addresses(data.server.address[0], int(peer[1]), [ip]).allowed:
            # Unreachable while the resolver guard is installed; counted so a test would notice.
            self.stats["upstream_blocked"] += 1
            data.server.error = f"arborl proxy: connected peer {ip} is not a public address"

    # -- resolver guard --------------------------------------------------------------------------

    def install_resolver_guard(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make every name resolution on ``loop`` apply the overrides and the address rule.

        mitmproxy opens upstream sockets with ``asyncio.open_connection(host, port)``, which
        resolves through ``loop.getaddrinfo``. Wrapping that method means the addresses actually
        connected to are exactly the ones checked, in the same call: a DNS-rebinding answer that
        changes between ``server_connect``'s check and the connect is filtered here, and the
        static ``resolve`` overrides reach mitmproxy too. IP literals skip resolution in asyncio;
        they were checked as literals.

        Args:
            loop: The event loop mitmproxy runs on.
        """
        self._raw_getaddrinfo = loop.getaddrinfo

        async def guarded(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
            name = host.decode() if isinstance(host, bytes) else str(host)
            override = self.s.resolve.get(policy_mod.normalise_host(name))
            if override is not None:
                ip = ipaddress.ip_address(override)
                family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
                sockaddr = (override, int(port), 0, 0) if ip.version == 6 else (override, int(port))
                infos = [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)]
            else:
                infos = await self._raw_getaddrinfo(host, port, *args, **kwargs)
            kept = [
                info
                for info in infos
                if self.s.policy.check_addresses(
                    name, int(port or 0), [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])]
                ).allowed
            ]
            if not kept:
                raise OSError(f"arborl proxy: every address of {name!r} is non-public; refused")
            return kept

        loop.getaddrinfo = guarded  # type: ignore[method-assign]

    def error(self, flow: http.HTTPFlow) -> None:
        """Count flows that ended in an error (upstream refused, body limit hit, ...)."""
        self.stats["errors"] += 1
        if flow.error and "body_size_limit" in flow.error.msg:
            self.stats["too_large"] += 1

    def snapshot(self) -> dict[str, Any]:
        """Counters plus identity, for the admin socket."""
        out: dict[str, Any] = dict(self.stats)
        out["mode"] = self.s.mode
        out["cache_entries"] = len(self.cache) if self.cache is not None else 0
        out["extra"] = self.s.extra
        return out
