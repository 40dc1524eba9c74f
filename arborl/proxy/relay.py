"""TCP -> unix socket relay that runs inside the sandbox (stdlib only, no arborl imports).

The sandbox has no network interfaces except loopback. The arborl proxy's unix socket is
bind-mounted into it (by convention at ``/run/arborl/proxy.sock``). Most HTTP clients only
understand ``HTTP_PROXY=http://host:port``, so this relay listens on ``127.0.0.1:3128`` inside
the sandbox and copies the bytes of every accepted TCP connection to a fresh connection on the
unix socket, in both directions, until both sides have closed.

What it isolates: nothing by itself. It is a byte pipe; all filtering happens in the proxy on the
other end of the socket. It adds no new reachability either: the sandboxed code could connect to
the bind-mounted socket directly.

It is deliberately a single dependency-free file so the sandbox can run it with any Python 3.8+
(for example Debian's ``/usr/bin/python3``), either as a script::

    python3 relay.py /run/arborl/proxy.sock 3128

or in-process, e.g. as a daemon thread started before user code::

    threading.Thread(target=relay.serve, args=("/run/arborl/proxy.sock",), daemon=True).start()

Each connection gets one thread per direction; half-closes are passed on (``shutdown(SHUT_WR)``)
so request bodies terminated by EOF still work.
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import sys
import threading

_CHUNK = 65536
# How long connecting to the unix socket may take before the client connection is dropped.
_CONNECT_TIMEOUT_S = 10.0


def _copy(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes from ``src`` to ``dst`` until EOF, then pass the half-close on.

    On an error (a reset on either side) both sockets are shut down completely, which also ends
    the copy running in the other direction.
    """
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _pump(client: socket.socket, upstream: socket.socket) -> None:
    """Copy both directions at once until both reach EOF.

    One thread per direction, so a peer that sends and receives at the same time (a TLS tunnel,
    a streaming upload) can never deadlock the relay on a full buffer.
    """
    back = threading.Thread(target=_copy, args=(upstream, client), name="relay-back", daemon=True)
    back.start()
    _copy(client, upstream)
    back.join()


class _RelayHandler(socketserver.BaseRequestHandler):
    """Forward one accepted TCP connection to the server's unix socket."""

    server: RelayServer

    def handle(self) -> None:
        client = self.request
        with contextlib.suppress(OSError):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.settimeout(_CONNECT_TIMEOUT_S)
            try:
                upstream.connect(self.server.socket_path)
            except OSError as exc:
                sys.stderr.write(f"relay: cannot connect to {self.server.socket_path}: {exc}\n")
                return
            upstream.settimeout(None)
            _pump(client, upstream)
        finally:
            upstream.close()


class RelayServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """A threaded TCP server whose connections are piped to ``socket_path``.

    Attributes:
        socket_path: The unix socket every connection is forwarded to.
    """

    daemon_threads = True
    allow_reuse_address = True
    # Many clients (a test suite, a crawler) may open connections in a burst.
    request_queue_size = 128

    def __init__(self, socket_path: str, address: tuple[str, int]) -> None:
        self.socket_path = socket_path
        super().__init__(address, _RelayHandler)

    @property
    def port(self) -> int:
        """The TCP port actually bound (useful when 0 was requested)."""
        return int(self.server_address[1])


def make_server(socket_path: str, port: int = 3128, host: str = "127.0.0.1") -> RelayServer:
    """Bind the relay's TCP listener without serving yet.

    Args:
        socket_path: Path of the proxy's unix socket, e.g. ``/run/arborl/proxy.sock``.
        port: TCP port to listen on; 0 picks a free one (read it back from ``.port``).
        host: Address to listen on; keep it on loopback.

    Returns:
        The bound server; call ``serve_forever()`` on it and ``shutdown()`` to stop it.

    Raises:
        FileNotFoundError: If ``socket_path`` does not exist (the bind mount is missing).
    """
    if not os.path.exists(socket_path):
        raise FileNotFoundError(
            f"proxy socket {socket_path!r} does not exist; bind-mount the arborl proxy's unix socket "
            "there (e.g. bwrap --bind HOST_SOCK /run/arborl/proxy.sock) before starting the relay"
        )
    return RelayServer(socket_path, (host, port))


def serve(socket_path: str, port: int = 3128, host: str = "127.0.0.1") -> None:
    """Listen on ``host:port`` and forward every connection to ``socket_path``; blocks forever.

    Args:
        socket_path: Path of the proxy's unix socket, e.g. ``/run/arborl/proxy.sock``.
        port: TCP port to listen on (clients use ``HTTP_PROXY=http://127.0.0.1:PORT``).
        host: Address to listen on; keep it on loopback.
    """
    server = make_server(socket_path, port, host)
    with server:
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``python3 relay.py SOCKET [PORT]``."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        sys.stderr.write("usage: python3 relay.py SOCKET_PATH [PORT]   (PORT defaults to 3128)\n")
        return 2
    try:
        port = int(args[1]) if len(args) == 2 else 3128
    except ValueError:
        sys.stderr.write(f"relay: PORT must be an integer, got {args[1]!r}\n")
        return 2
    try:
        serve(args[0], port)
    except FileNotFoundError as exc:
        sys.stderr.write(f"relay: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
