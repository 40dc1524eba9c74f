"""Start and stop the arborl proxy process from arborl's main process (stdlib only).

``ProxyServer`` writes the config as JSON into a state directory, starts
``<proxy-venv>/bin/python arborl/proxy/proxy_main.py`` (mitmproxy lives only in that venv, see
``scripts/setup/proxy.sh``), and waits for its ``ARBORL_PROXY_READY`` line. The child's stdin is a
pipe this process holds, so the proxy exits by itself if this process dies. Its stderr goes to
``<state_dir>/proxy.log``.

Example::

    cfg = ProxyConfig(allow=("*.wikipedia.org",), mode="record", cache_path="web.sqlite")
    with ProxyServer(cfg) as proxy:
        sandbox.bind(proxy.socket_path, "/run/arborl/proxy.sock")
        env.update(proxy.client_env(ca_cert="/run/arborl/proxy-ca.pem"))
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .config import ProxyConfig, default_confdir, default_venv

_MAIN = Path(__file__).resolve().parent / "proxy_main.py"
_READY = "ARBORL_PROXY_READY "


class ProxyUnavailableError(RuntimeError):
    """The proxy venv (with mitmproxy 11.0.2) is missing."""


def proxy_python(venv: str | os.PathLike[str] | None = None) -> Path:
    """The interpreter of the proxy venv, checked to exist.

    Args:
        venv: The venv directory; default ``$ARBORL_PROXY_VENV`` or ``~/.cache/arborl/proxy-venv``.

    Returns:
        Path of ``bin/python`` in that venv.

    Raises:
        ProxyUnavailableError: If the venv or its mitmproxy is missing; the message says how to fix it.
    """
    root = Path(venv).expanduser() if venv else default_venv()
    python = root / "bin" / "python"
    site = list(root.glob("lib/python3*/site-packages/mitmproxy"))
    if not python.exists() or not site:
        raise ProxyUnavailableError(
            f"no proxy venv with mitmproxy at {root}; create it with `bash scripts/setup/proxy.sh` "
            "(or point ARBORL_PROXY_VENV at a venv that has mitmproxy==11.0.2)"
        )
    return python


def query_admin(admin_path: str, command: str = "stats", timeout: float = 5.0) -> Any:
    """Send one command to a proxy's admin socket and return its decoded JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(admin_path)
        s.sendall(command.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


@contextlib.contextmanager
def _ca_creation_lock(confdir: str) -> Iterator[None]:
    """Hold an exclusive lock on ``confdir`` while its CA does not exist yet; no-op afterwards."""
    if os.path.exists(os.path.join(confdir, "mitmproxy-ca.pem")):
        yield
        return
    with open(os.path.join(confdir, ".create.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class ProxyServer:
    """A running proxy process; also a context manager.

    Args:
        config: What to filter, cache and where to listen.
    """

    def __init__(self, config: ProxyConfig):
        self._base = config
        self.config = config  # after start(): with state_dir, socket_path and confdir filled in
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp_dir: str | None = None  # a state dir we created and must remove
        self._ready: dict[str, Any] = {}
        self._log: IO[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def _resolved_config(self) -> ProxyConfig:
        cfg = self._base
        state_dir = cfg.state_dir
        if state_dir is None:
            # Short prefix under /tmp keeps the socket path far below the 107-byte limit.
            state_dir = self._tmp_dir = tempfile.mkdtemp(prefix="arborl-px-")
        os.makedirs(state_dir, exist_ok=True)
        os.chmod(state_dir, 0o711)  # others may traverse to the socket but not list the dir
        socket_path = cfg.socket_path or os.path.join(state_dir, "proxy.sock")
        os.makedirs(os.path.dirname(os.path.abspath(socket_path)), exist_ok=True)
        if os.path.lexists(socket_path) and not stat.S_ISSOCK(os.lstat(socket_path).st_mode):
            raise FileExistsError(
                f"socket_path {socket_path!r} exists and is not a socket; choose another path"
            )
        confdir = cfg.confdir or str(default_confdir())
        os.makedirs(confdir, exist_ok=True)
        cache_path = os.path.abspath(cfg.cache_path) if cfg.cache_path else None
        if cache_path and cfg.mode == "replay" and not os.path.exists(cache_path):
            raise FileNotFoundError(
                f"replay cache {cache_path!r} does not exist; record one first (mode='record') or fix cache_path"
            )
        if cache_path:
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        upstream_ca = os.path.abspath(cfg.upstream_ca) if cfg.upstream_ca else None
        if upstream_ca and not os.path.isfile(upstream_ca):
            raise FileNotFoundError(f"upstream_ca {upstream_ca!r} is not a file; point it at a PEM bundle")
        return replace(
            cfg,
            state_dir=state_dir,
            socket_path=socket_path,
            confdir=confdir,
            cache_path=cache_path,
            upstream_ca=upstream_ca,
        )

    def start(self) -> ProxyServer:
        """Spawn the proxy process and wait until it listens.

        Returns:
            self, for chaining.

        Raises:
            ProxyUnavailableError: If the proxy venv is missing.
            RuntimeError: If the process exits or is not ready within ``start_timeout_s``; the
                message includes the tail of its log.
        """
        if self._proc is not None:
            raise RuntimeError("proxy already started; call stop() first")
        python = proxy_python(self._base.venv)
        try:
            cfg = self._resolved_config()
        except BaseException:
            self.stop()  # removes a temporary state dir made before the error
            raise
        self.config = cfg
        assert cfg.state_dir is not None and cfg.confdir is not None
        cfg_path = os.path.join(cfg.state_dir, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg.to_dict(), f)
        self._log = open(os.path.join(cfg.state_dir, "proxy.log"), "ab")  # noqa: SIM115 (closed in stop)
        # mitmproxy writes its CA on first start; proxies starting together on a fresh confdir
        # must not race on those files, so the first one creates them under a lock.
        with _ca_creation_lock(cfg.confdir):
            self._proc = subprocess.Popen(
                [str(python), "-I", str(_MAIN), "--config", cfg_path, "--watch-stdin"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                close_fds=True,
                # Own session: a terminal's Ctrl-C reaches only the parent, which then stops the
                # proxy in order. If the parent dies instead, the proxy sees EOF on stdin and exits.
                start_new_session=True,
            )
            try:
                self._ready = self._wait_ready(cfg.start_timeout_s)
            except BaseException:
                self.stop()
                raise
        return self

    def _wait_ready(self, timeout: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self._proc.stdout.fileno()
        buf = b""
        while time.monotonic() < deadline:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")  # keep a partial last line for the next read
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith(_READY):
                    return dict(json.loads(text[len(_READY) :]))
        try:
            rc: int | None = self._proc.wait(timeout=2)  # stdout closed: the exit code is imminent
        except subprocess.TimeoutExpired:
            rc = None
        why = f"exited with code {rc}" if rc is not None else f"was not ready within {timeout} s"
        raise RuntimeError(f"arborl proxy {why}; log tail:\n{self.log_tail()}")

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and remove a temporary state dir."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        """Whether the proxy process is running."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The proxy process's exit code once it has exited, else None."""
        return None if self._proc is None else self._proc.poll()

    # -- what clients need -----------------------------------------------------------------------

    def _need(self, key: str) -> Any:
        if not self._ready:
            raise RuntimeError("proxy is not running; call start() first")
        return self._ready[key]

    @property
    def socket_path(self) -> str:
        """The unix socket to bind-mount into a sandbox (at ``/run/arborl/proxy.sock``)."""
        path = self._need("socket")
        if not path:
            raise RuntimeError("this proxy has unix_socket=False; use .port/.url instead")
        return str(path)

    @property
    def port(self) -> int:
        """mitmproxy's TCP port on 127.0.0.1 (reachable from the host, not from a sandbox netns)."""
        return int(self._need("port"))

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, for host-side clients."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca_cert_path(self) -> str:
        """mitmproxy's CA certificate (PEM) that HTTPS clients must trust for interception."""
        return str(self._need("ca_cert"))

    @property
    def pid(self) -> int:
        """Process id of the proxy."""
        return int(self._need("pid"))

    def stats(self) -> dict[str, Any]:
        """Counters from the running proxy (see ``addon.COUNTERS``), plus mode and cache size."""
        return dict(query_admin(self._need("admin"), "stats"))

    def client_env(
        self, proxy_url: str = "http://127.0.0.1:3128", ca_cert: str | None = None
    ) -> dict[str, str]:
        """Environment variables that route common clients through the proxy.

        Args:
            proxy_url: The proxy as seen by the client (inside a sandbox: the relay's address).
            ca_cert: Path of the CA PEM as seen by the client; None leaves HTTPS trust untouched.

        Returns:
            ``HTTP(S)_PROXY`` in both cases, an empty ``NO_PROXY``, and the CA variables read by
            OpenSSL, requests, curl and Node when ``ca_cert`` is given.
        """
        env = {k: proxy_url for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")}
        env.update(NO_PROXY="", no_proxy="")
        if ca_cert:
            for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
                env[k] = ca_cert
        return env

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the proxy's stderr log."""
        if not self.config.state_dir:
            return ""
        path = os.path.join(self.config.state_dir, "proxy.log")
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except FileNotFoundError:
            return ""
