"""Network policy of the arborl proxy: which hosts and addresses a sandbox may reach (stdlib only).

This module is imported both by arborl's main process (to validate a ``ProxyConfig``) and by the
proxy process that runs in its own venv, so it must import nothing but the standard library and
use no ``arborl`` imports.

What it enforces, in order:

1. **Domain lists.** A host must match the allow list and must not match the deny list; the deny
   list wins. Patterns are exact names (``example.com``), ``*.example.com`` (any subdomain, but
   not ``example.com`` itself), or ``*`` (everything). Matching is case-insensitive and ignores a
   trailing dot. No other wildcards: ``*example.com`` would also match ``evilexample.com``.
2. **Destination address.** After resolution, every address the name resolves to must be globally
   routable. Loopback, RFC 1918 private, link-local (which includes the cloud metadata address
   169.254.169.254), unique-local IPv6 (which includes ``fd00:ec2::254``), shared/CGNAT,
   multicast, unspecified and reserved ranges are refused, as are IPv4 addresses embedded in IPv6
   (v4-mapped, NAT64, 6to4). Only explicit ``host:port`` exceptions (``allow_private``) bypass
   this; they exist so tests can reach a loopback upstream.

What it does not do: resolve names (the proxy resolves and pins the address it checked, so DNS
rebinding between check and connect is impossible), inspect bodies, or limit rates.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Addresses refused even if some future `ipaddress` release called them global.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack instance metadata
        ipaddress.ip_address("fd00:ec2::254"),  # AWS IPv6 instance metadata
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud metadata
    }
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def normalise_host(host: str) -> str:
    """Lower-case a host name, drop a trailing dot and IPv6 brackets.

    Args:
        host: A host as it appears in a URL or CONNECT line.

    Returns:
        The canonical form used for matching.
    """
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def validate_pattern(pattern: str) -> str:
    """Check a domain pattern and return its canonical form.

    Args:
        pattern: ``example.com``, ``*.example.com`` or ``*``.

    Returns:
        The normalised pattern.

    Raises:
        ValueError: If the pattern uses an unsupported wildcard or is empty.
    """
    canon = normalise_host(pattern)
    if canon == "*" and pattern.strip() == "*":
        return canon
    body = canon[2:] if canon.startswith("*.") else canon
    # `canon == "*"` here means e.g. "*." which must not silently widen to "every host".
    if canon == "*" or not body or "*" in body or "/" in body or " " in body:
        raise ValueError(
            f"bad domain pattern {pattern!r}: use an exact host ('example.com'), a subdomain "
            "wildcard ('*.example.com') or '*' for every host"
        )
    return canon


def host_matches(host: str, pattern: str) -> bool:
    """Whether ``host`` matches one domain pattern (see the module docstring for the syntax).

    Args:
        host: A host name or IP literal.
        pattern: A pattern already checked by :func:`validate_pattern`.

    Returns:
        True if the host matches.
    """
    host = normalise_host(host)
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def parse_host_port(entry: str) -> tuple[str, int]:
    """Split ``host:port`` or ``[v6]:port`` into a normalised host and an int port.

    Args:
        entry: The string to split.

    Returns:
        ``(host, port)``.

    Raises:
        ValueError: If the port is missing or not in 1..65535.
    """
    host, sep, port_s = entry.strip().rpartition(":")
    if not sep or not host or (":" in host and not host.startswith("[")):
        raise ValueError(
            f"bad host:port {entry!r}: expected 'host:port' or '[v6addr]:port', e.g. '127.0.0.1:8080'"
        )
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"bad port in {entry!r}: {port_s!r} is not an integer") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {entry!r}: must be in 1..65535")
    return normalise_host(host), port


def authority_host(authority: str) -> str:
    """The host part of a ``Host`` header or ``:authority`` (``h``, ``h:port``, ``[v6]:port``)."""
    authority = authority.strip()
    if authority.startswith("["):
        return normalise_host(authority[: authority.find("]") + 1])
    if authority.count(":") == 1:
        return normalise_host(authority.split(":", 1)[0])
    return normalise_host(authority)


def ip_literal(host: str) -> IPAddress | None:
    """Return the IP address if ``host`` is an IP literal, else None."""
    try:
        return ipaddress.ip_address(normalise_host(host))
    except ValueError:
        return None


def blocked_reason(ip: IPAddress) -> str | None:
    """Say why a destination address is refused, or None if it is globally routable.

    Args:
        ip: A resolved destination address.

    Returns:
        A short reason such as ``"loopback"``, or None when the address may be reached.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = blocked_reason(embedded)
            return f"embeds {embedded} ({inner})" if inner else None
    if ip in METADATA_ADDRESSES:
        return "cloud metadata address"
    checks = (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    )
    for name, hit in checks:
        if hit:
            return name
    if isinstance(ip, ipaddress.IPv6Address) and ip in ipaddress.ip_network("fc00::/7"):
        return "unique-local"
    if not ip.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True)
class Decision:
    """The outcome of a policy check.

    Attributes:
        allowed: True if the request may proceed.
        reason: Why it was refused (empty when allowed).
    """

    allowed: bool
    reason: str = ""


ALLOW = Decision(True)


class Policy:
    """Domain allow/deny lists plus the private-address rule, checked by the proxy addon.

    Args:
        allow: Domain patterns that may be reached (empty: nothing).
        deny: Domain patterns that are refused even if allowed.
        allow_private: ``host:port`` exceptions to the private-address rule; ``host`` is compared
            with both the requested name and the resolved address.
    """

    def __init__(self, allow: Iterable[str], deny: Iterable[str] = (), allow_private: Iterable[str] = ()):
        self.allow = tuple(validate_pattern(p) for p in allow)
        self.deny = tuple(validate_pattern(p) for p in deny)
        self.allow_private = frozenset(parse_host_port(e) for e in allow_private)

    def check_host(self, host: str) -> Decision:
        """Apply the domain lists to a requested host name (before any resolution).

        Args:
            host: The host from the URL or the CONNECT line.

        Returns:
            The decision; a refusal names the matching deny pattern or the missing allow entry.
        """
        canon = normalise_host(host)
        if not canon:
            return Decision(False, "request has no host")
        for pattern in self.deny:
            if host_matches(canon, pattern):
                return Decision(False, f"host {canon!r} matches deny pattern {pattern!r}")
        if not any(host_matches(canon, p) for p in self.allow):
            return Decision(False, f"host {canon!r} is not in the allow list")
        return ALLOW

    def private_exempt(self, host: str, ip: IPAddress | None, port: int) -> bool:
        """Whether ``host:port`` (or ``ip:port``) is an explicit private-address exception."""
        if (normalise_host(host), port) in self.allow_private:
            return True
        return ip is not None and (str(ip), port) in self.allow_private

    def check_addresses(self, host: str, port: int, addresses: Iterable[IPAddress]) -> Decision:
        """Apply the private-address rule to every address a host resolved to.

        All addresses are checked, not just the first, because a rebinding name may list a public
        and a private address and let the client's resolver pick.

        Args:
            host: The requested host name.
            port: The destination port.
            addresses: What ``host`` resolved to.

        Returns:
            The decision; a refusal names the address and its class.
        """
        addrs = list(addresses)
        if not addrs:
            return Decision(False, f"host {normalise_host(host)!r} did not resolve to any address")
        for ip in addrs:
            reason = blocked_reason(ip)
            if reason and not self.private_exempt(host, ip, port):
                return Decision(
                    False,
                    f"host {normalise_host(host)!r} resolves to {ip} ({reason}); "
                    "non-public destinations are refused",
                )
        return ALLOW
