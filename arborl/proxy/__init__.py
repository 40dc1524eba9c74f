"""arborl.proxy: a filtering, record/replay network proxy for sandboxed code.

The proxy itself (mitmproxy 11.0.2) runs as a separate process in its own venv; this package's
main-process API (``ProxyConfig``, ``ProxyServer``) uses only the standard library. See
``docs/proxy.md`` for the design and threat model, and ``relay.py`` for the in-sandbox relay.
"""

from .config import ProxyConfig
from .server import ProxyServer, ProxyUnavailableError, proxy_python

__all__ = ["ProxyConfig", "ProxyServer", "ProxyUnavailableError", "proxy_python"]
