"""Docker sandbox backend: a warm pool of locked-down containers, one snippet per ``docker exec``.

What it isolates. Each container runs with ``--network none`` (no interface but loopback), a
read-only root made only of a Python interpreter and its stdlib (no shell, no host files, no
host environment), ``--cap-drop ALL``, ``no-new-privileges``, the seccomp filter of the other backends
(:func:`arborl.sandbox.seccomp.docker_profile`: ``ptrace``, ``mount``, ``bpf``, ``keyctl``,
``unshare``, ``CLONE_NEWUSER``, ``ioctl(TIOCSTI)`` with the masked 32-bit compare, ``AF_INET6``
sockets always and ``AF_INET`` unless a proxy is configured, io_uring, ...; blocked calls fail
with ``EPERM``) in place of Docker's default profile, a uid/gid of its own per container (leased
from :mod:`arborl.sandbox.uids`, so no other sandbox on the host shares it), a cgroup memory
limit (swap off), a pids limit, ``--ipc none`` (so no ``/dev/shm``) and one writable place: a
size-capped ``noexec`` tmpfs at ``/scratch``. The container's own pid namespace means everything
the snippet starts can be found and killed.

Per run. A small runner (``RUNNER`` in ``_docker_image.py``, run as the container's uid via
``docker exec``) cleans the container (below), writes the caller's files, then starts the snippet in a
fresh interpreter with ``RLIMIT_CPU`` and relays its stdout/stderr as framed, capped chunks.
When the snippet exits (or hits the wall deadline) the runner kills every other process of the
sandbox user, so a double-forked daemon cannot outlive its run nor hold the pipes open, and
cleans the container again. If anything goes wrong (host-side deadline, runner killed, broken
framing, a container left dirty) the container is destroyed with ``docker kill`` and replaced in
the background: the docker CLI dying never stops a container by itself, so the kill is always
explicit. Pool containers run with ``--rm`` and their pid 1 exits after ``idle_ttl_s`` without
a run, so even a SIGKILLed owner leaves nothing behind for long. After a burst of concurrent
runs has started extra containers, those beyond ``idle_size`` are removed once idle for
``shrink_after_s`` (:class:`~arborl.sandbox.pool.IdlePool`).

Cleanliness guarantee between runs on one container. A warm container's IPC and network
namespaces are shared by all its runs (making new ones needs privileges the runner does not
have), so the runner cleans what outlives processes, before and after every run: it kills every
process of the sandbox user until none is left (``kill(-1)``; pid 1 is immune and only reaps),
removes every SysV shared-memory segment, message queue and semaphore set and every POSIX message
queue (all owned by the sandbox user), and wipes ``/scratch`` iteratively
(:func:`arborl.sandbox.scratch.wipe`: no depth, path-length or permission trick stops it). It then
checks that none of these is left, and that the network namespace holds no socket and no
TIME_WAIT but its own relay's listener (``/proc/net/sockstat{,6}``): socket state can outlive
its process and cannot be cleared without privileges. A container that fails the check is never
reused: found before a run, the run is retried on another container (nothing of it ran); found
after a run, the container is replaced in the background. Containers run with
``net.ipv4.tcp_max_tw_buckets=0``, so closed connections leave no TIME_WAIT and proxied runs keep
their container. Nothing else is writable, and memory the snippet used is freed with its
processes and its IPC objects.

What it does NOT isolate: the kernel is shared (a kernel exploit escapes; use a microVM for that,
see ``docs/microvm.md``); runc is the boundary (Debian's 1.1.5+ds1-1+deb12u1 carries the
CVE-2024-21626 fix); CPU time is shared with the host beyond ``--cpus``; the seccomp filter is a
deny list on top of Docker's isolation, not an allow list (Docker's default profile, an allow
list, is replaced by it: the syscalls only that profile refuses, such as ``reboot`` or
``init_module``, are left to ``--cap-drop ALL``, user 65534 and the namespaces). A snippet can signal its own runner (same uid): that only
ends its own run (timed out, or an error result) and the container is replaced.

The image is built locally (no registry needed) by :func:`ensure_image` from the host's own
interpreter: the binary, the shared libraries it and its extension modules load, and the stdlib.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

from arborl.sandbox import seccomp, uids
from arborl.sandbox._docker_image import BOOT, REAPER, RUNNER, ensure_image
from arborl.sandbox.base import ExecResult, Limits, SandboxError
from arborl.sandbox.common import (
    PROXY_SOCKET_IN_SANDBOX,
    check_proxy_socket,
    cpu_limit_hit,
    relay_source,
    validate_files,
)
from arborl.sandbox.output import read_capped
from arborl.sandbox.pool import IdlePool

LABEL = "arborl.sandbox"
"""Every container this module creates carries ``--label arborl.sandbox=1`` (see :func:`remove_leftovers`)."""

_PROXY_IN_CONTAINER = PROXY_SOCKET_IN_SANDBOX
_PROXY_URL = "http://127.0.0.1:3128"  # the relay inside the container (arborl/proxy/relay.py)
_GRACE_S = 0.7  # host-side backstop after the runner's own wall kill
_DOCKER_CALL_S = 30.0

def _docker(*args: str, host: str | None, timeout: float = _DOCKER_CALL_S) -> subprocess.CompletedProcess[str]:
    cmd = ["docker", *(["--host", host] if host else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def remove_leftovers(*, docker_host: str | None = None, owner: str | None = None) -> int:
    """Force-remove containers labelled by this module (all of them, or those of one ``owner``).

    Returns:
        How many containers were removed.
    """
    label = f"{LABEL}.owner={owner}" if owner else f"{LABEL}=1"
    ids = _docker("ps", "-aq", "--filter", f"label={label}", host=docker_host).stdout.split()
    if ids:
        _docker("rm", "-f", *ids, host=docker_host)
    return len(ids)


class DockerBackend:
    """Runs snippets in a warm pool of hardened containers (see the module docstring).

    Args:
        limits: Per-run limits. Memory, pids and scratch size are container-wide limits fixed at
            container start; ``cpu_s`` and ``wall_s`` are enforced per run.
        proxy_socket: Host path of the network proxy's unix socket (mode 0666); bind-mounted at
            ``/run/arborl/proxy.sock``; a relay in the runner serves it on ``127.0.0.1:3128``,
            which ``HTTP(S)_PROXY`` point at (the container has no other way out).
        warm: ``True`` (default) keeps ``pool_size`` containers started and ``docker exec``s into
            them; ``False`` starts a fresh ``docker run --rm`` container per run (slow, simple).
        pool_size: Number of containers started up front and kept warm.
        idle_size: How many idle containers to keep after a burst of concurrent runs has started
            more (default ``pool_size``): those beyond it are removed once idle for ``shrink_after_s``.
        shrink_after_s: How long a container beyond ``idle_size`` may stay idle.
        docker_host: Daemon address (``unix:///...``); default: the CLI's default / ``DOCKER_HOST``.
        idle_ttl_s: A pool container with no run for this long exits and is removed (it is then
            replaced on demand); bounds how long containers outlive an owner killed with SIGKILL.
        image: Image to run; default :func:`~arborl.sandbox._docker_image.image_tag`, built by :func:`ensure_image` if missing.
    """

    name: ClassVar[str] = "docker"
    # Every property of the threat suite (tests/sandbox); see the module docstring for how.
    guarantees: ClassVar[frozenset[str]] = frozenset(
        {"env", "host_files", "network", "pids", "memory", "disk", "cpu", "orphans", "privileges", "cross_run"}
    )

    def __init__(self, limits: Limits, *, proxy_socket: str | None = None, warm: bool = True,
                 pool_size: int = 2, docker_host: str | None = None, image: str | None = None,
                 idle_ttl_s: float = 900.0, idle_size: int | None = None, shrink_after_s: float = 10.0) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        idle = IdlePool(self._destroy, idle_size=pool_size if idle_size is None else idle_size,
                        shrink_after_s=shrink_after_s)  # validates both before anything starts
        # Resolved once: the per-run docker CLI gets a minimal environment without DOCKER_HOST.
        docker_host = docker_host or os.environ.get("DOCKER_HOST") or None
        proxy_socket = check_proxy_socket(proxy_socket)
        reason = self.probe(docker_host=docker_host)
        if reason is not None:
            raise SandboxError(reason)
        self.limits = limits
        self.warm = warm
        self._idle_ttl_s = idle_ttl_s
        self._host = docker_host
        self._proxy = proxy_socket
        self._image = image or ensure_image(docker_host=docker_host)
        self._seccomp_path = _write_profile(allow_inet=proxy_socket is not None)
        self._owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._idle: IdlePool[str] = idle
        self._live: set[str] = set()
        self._uids: dict[str, uids.UidLease] = {}  # container name -> the uid all its processes run as
        self._lock = threading.Lock()
        self._closed = False
        self._refill = ThreadPoolExecutor(max_workers=2, thread_name_prefix="arborl-docker-pool")
        # If close() is never called, remove this backend's containers at garbage collection / exit.
        self._finalizer = weakref.finalize(self, remove_leftovers, docker_host=docker_host, owner=self._owner)
        if warm:
            for cid in self._refill.map(lambda _: self._start_container(), range(pool_size)):
                self._idle.put(cid)

    @classmethod
    def probe(cls, *, docker_host: str | None = None) -> str | None:
        """``None`` if the docker CLI reaches a running daemon, else the reason and the fix."""
        if shutil.which("docker") is None:
            return "docker CLI not found; run scripts/setup/docker.sh (installs docker.io, starts dockerd)"
        try:
            r = _docker("version", "--format", "{{.Server.Version}}", host=docker_host, timeout=10)
        except subprocess.TimeoutExpired:
            return "docker daemon did not answer within 10 s; restart dockerd (scripts/setup/docker.sh)"
        if r.returncode != 0:
            return f"docker daemon unreachable ({r.stderr.strip()[:200]}); start it with scripts/setup/docker.sh"
        return None  # a missing image is not fatal: the constructor builds it (ensure_image)

    # -- containers -------------------------------------------------------------------------

    def _security_args(self, uid: int) -> list[str]:
        lim = self.limits
        mem = lim.memory_mb + 32  # runner + reaper overhead, so the snippet gets about memory_mb
        # pids + 2: the pid-1 reaper and the runner, so the snippet and its children get ``pids``.
        args = [
            "--label", f"{LABEL}=1", "--label", f"{LABEL}.owner={self._owner}",
            "--network", "none", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--security-opt", f"seccomp={self._seccomp_path}",
            "--ipc", "none",
            "--memory", f"{mem}m", "--memory-swap", f"{mem}m", "--pids-limit", str(lim.pids + 2),
            "--cpus", "1", "--ulimit", "core=0", "--ulimit", "nofile=1024:1024",
            "--user", f"{uid}:{uid}", "--workdir", "/scratch", "--hostname", "sandbox",
            "--tmpfs", f"/scratch:size={lim.disk_mb}m,mode=1777,nosuid,nodev,noexec",
            "--log-driver", "none",
            # The container's network namespace serves all its runs: closed TCP connections skip
            # TIME_WAIT (which would show a later run's /proc/net/tcp what this one connected to,
            # and make the runner replace the container). Safe on a loopback-only namespace.
            "--sysctl", "net.ipv4.tcp_max_tw_buckets=0",
        ]
        if self._proxy:
            args += ["-v", f"{os.path.abspath(self._proxy)}:{_PROXY_IN_CONTAINER}"]
        return args

    def _lease_uid(self, name: str) -> int:
        lease = uids.lease()
        with self._lock:
            self._live.add(name)
            self._uids[name] = lease
        return lease.uid

    def _release_uid(self, name: str) -> None:
        """Give the container's uid back once nothing of it runs any more."""
        with self._lock:
            lease = self._uids.pop(name, None)
        if lease is not None:
            lease.release()

    def _start_container(self) -> str:
        name = f"arborl-sbx-{uuid.uuid4().hex[:12]}"
        uid = self._lease_uid(name)
        r = _docker("run", "-d", "--rm", "--name", name, *self._security_args(uid), self._image,
                    "/usr/bin/python3", "-I", "-S", "-c", REAPER, str(self._idle_ttl_s), host=self._host)
        if r.returncode != 0:
            self._destroy(name)
            raise SandboxError(f"docker run failed: {r.stderr.strip()[:500]}")
        return name

    def _destroy(self, name: str) -> None:
        """Kill and remove one container (SIGKILL first: ``rm -f`` alone may wait on stop)."""
        _docker("kill", name, host=self._host, timeout=10)
        _docker("rm", "-f", name, host=self._host)
        with self._lock:
            self._live.discard(name)
        self._release_uid(name)

    def _recycle(self, name: str) -> None:
        """Destroy a container whose state is unknown and start a replacement in the background."""
        def job() -> None:
            self._destroy(name)
            if not self._closed:
                try:
                    new = self._start_container()
                except SandboxError:
                    return  # the next run_python starts one synchronously and reports the error
                if self._closed:
                    self._destroy(new)
                else:
                    self._idle.put(new)
        # RuntimeError: executor shut down, close() is removing everything anyway.
        with contextlib.suppress(RuntimeError):
            self._refill.submit(job)

    # -- one run ----------------------------------------------------------------------------

    def _payload(self, code: str, stdin: str, files: dict[str, bytes] | None) -> bytes:
        items = sorted(validate_files(files).items())
        # USER: the container's uid has no passwd entry (getpass.getuser() reads USER first).
        env = {"PATH": "/usr/bin:/bin", "HOME": "/scratch", "TMPDIR": "/scratch", "LANG": "C.UTF-8", "USER": "nobody"}
        extra: dict[str, str] = {}
        if self._proxy:
            env.update({v: _PROXY_URL for v in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")})
            env.update({v.lower(): _PROXY_URL for v in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")})
            env["NO_PROXY"] = env["no_proxy"] = ""
            extra = {"relay": relay_source(), "proxy_socket": _PROXY_IN_CONTAINER}
        header = json.dumps({**extra,
            "code": code, "boot": BOOT, "env": env, "cap": self.limits.output_bytes,
            "cpu_s": max(1, int(self.limits.cpu_s + 0.999)), "wall_s": self.limits.wall_s,
            "files": [[fname, len(data)] for fname, data in items],
        }).encode()
        return b"".join([struct.pack(">Q", len(header)), header, *(d for _, d in items),
                         stdin.encode("utf-8", "surrogatepass")])

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run ``code`` with ``python3`` in a clean container scratch dir; see :class:`ExecResult`."""
        if self._closed:
            raise SandboxError("DockerBackend is closed; create a new one")
        t0 = time.monotonic()
        payload = self._payload(code, stdin, files)
        res = self._run_warm(payload) if self.warm else self._run_cold(payload)
        res.duration_s = time.monotonic() - t0
        return res

    def _run_warm(self, payload: bytes) -> ExecResult:
        for attempt in range(2):
            name = self._idle.get(timeout=2.0) or self._start_container()  # none idle: start one
            lease = self._uids.get(name)
            if lease is None:  # close() released it meanwhile
                raise SandboxError("DockerBackend is closed; create a new one")
            uid = lease.uid
            cmd = self._cli("exec", "-i", "-u", f"{uid}:{uid}", "-w", "/scratch", name)
            out, err, rc, killed = self._drive(cmd, payload)
            res, status = self._parse(out, err, rc, killed)
            if not killed and res.error is None and not status.get("dirty"):
                self._idle.put(name)
                return res
            # Killed, broken, or left with state a later run could see: never reused.
            self._recycle(name)
            # Nothing of this snippet ran if the container died between runs (pid 1 gone, idle
            # TTL: the runner never started) or was found unclean before the run: run it once
            # more on another container.
            gone = not out and (b"is not running" in err or b"No such container" in err)
            if killed or attempt or not (gone or status.get("retry")):
                return res
        return res

    def _run_cold(self, payload: bytes) -> ExecResult:
        name = f"arborl-sbx-{uuid.uuid4().hex[:12]}"
        uid = self._lease_uid(name)
        cmd = self._cli("run", "--rm", "-i", "--init", "--name", name, *self._security_args(uid), self._image)
        out, err, rc, killed = self._drive(cmd, payload)
        if killed:  # the container may still run: kill it (``--rm`` then removes it)
            with contextlib.suppress(RuntimeError):  # executor shut down: close() removes it
                self._refill.submit(self._destroy, name)
        else:
            with self._lock:
                self._live.discard(name)
            self._release_uid(name)
        return self._parse(out, err, rc, killed)[0]

    def _cli(self, *args: str) -> list[str]:
        return ["docker", *(["--host", self._host] if self._host else []), *args,
                "/usr/bin/python3", "-I", "-S", "-c", RUNNER]

    def _drive(self, cmd: list[str], payload: bytes) -> tuple[bytes, bytes, int, bool]:
        """Run the CLI, feed the payload, read capped output; stop the CLI at the deadline."""
        cap = 2 * self.limits.output_bytes + (1 << 16)  # frames can't exceed this unless forged
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        bufs: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}
        readers = [threading.Thread(target=read_capped, args=(p.stdout.fileno(), bufs["out"], cap), daemon=True),
                   threading.Thread(target=read_capped, args=(p.stderr.fileno(), bufs["err"], 1 << 16), daemon=True),
                   threading.Thread(target=_feed, args=(p.stdin, payload), daemon=True)]
        for t in readers:
            t.start()
        killed = False
        # Cold runs also wait for the container to start (~0.4 s, more under load).
        deadline = self.limits.wall_s + _GRACE_S + (0.0 if self.warm else 2.0)
        # Wait on the stdout reader (EOF = the run is over): a thread join sleeps on a lock,
        # where Popen.wait(timeout) polls in steps of up to 50 ms.
        readers[0].join(timeout=deadline)
        if readers[0].is_alive():
            # Only the CLI dies here; the caller kills the container itself in the background
            # (``docker kill`` can take seconds on a busy host and must not delay the result).
            killed = True
            p.kill()
        try:
            p.wait(timeout=2.0)
        except subprocess.TimeoutExpired:  # CLI alive after closing its stdout: stop it
            p.kill()
            p.wait()
        for t in readers[:2]:
            t.join(timeout=2.0)
        return bytes(bufs["out"]), bytes(bufs["err"]), p.returncode, killed

    def _parse(self, out: bytes, err: bytes, rc: int, killed: bool) -> tuple[ExecResult, dict[str, object]]:
        """The run's result, and the runner's status (``{}`` if it sent none)."""
        chunks: dict[bytes, list[bytes]] = {b"o": [], b"e": []}
        status: dict[str, object] | None = None
        i = 0
        while i + 5 <= len(out):
            kind, n = out[i:i + 1], struct.unpack(">I", out[i + 1:i + 5])[0]
            data = out[i + 5:i + 5 + n]
            i += 5 + n
            if kind == b"x":
                status = json.loads(data)
                break
            if kind in chunks:
                chunks[kind].append(data)
        stdout = b"".join(chunks[b"o"]).decode("utf-8", "replace")
        stderr = b"".join(chunks[b"e"]).decode("utf-8", "replace")
        if status is None or "rc" not in status:
            why = "killed at the wall deadline" if killed else (
                (status or {}).get("error") or f"runner exited {rc} without a status: {err.decode()[-300:]}")
            return ExecResult(ok=False, exit_code=-9 if killed else rc, stdout=stdout, stderr=stderr,
                              timed_out=killed, backend=self.name,
                              error=None if killed else f"docker sandbox: {why}"), status or {}
        exit_code = int(status["rc"])  # type: ignore[call-overload]
        # RLIMIT_CPU: SIGXCPU at the soft limit, or SIGKILL at the hard one if SIGXCPU was ignored.
        timed_out = bool(status["wall"]) or cpu_limit_hit(exit_code, float(status.get("cpu", 0.0)), self.limits)
        memory = bool(status["oom"]) or (exit_code == 1 and "MemoryError" in stderr[-2000:])
        return ExecResult(ok=exit_code == 0 and not timed_out and not memory, exit_code=exit_code,
                          stdout=stdout, stderr=stderr, timed_out=timed_out, memory_exceeded=memory,
                          output_truncated=bool(status["trunc"]), backend=self.name), status

    def close(self) -> None:
        """Remove every container of this backend; idempotent."""
        self._closed = True
        self._idle.close()
        self._refill.shutdown(wait=True)
        with self._lock:
            names = sorted(self._live)
        if names:
            _docker("rm", "-f", *names, host=self._host)
        self._finalizer()  # remove_leftovers for this owner, once
        with self._lock:
            self._live.clear()
            leases, self._uids = list(self._uids.values()), {}
        for lease in leases:
            lease.release()

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_profile(*, allow_inet: bool) -> str:
    """Write the seccomp profile (named by its content) into this user's private directory.

    The docker CLI reads the file at every ``docker run``, so it must outlive the backend; being
    named by its content, it is shared by every backend of this user and nothing is left behind
    per backend (not even by an owner killed with SIGKILL).

    Returns:
        The file's path, for ``--security-opt seccomp=PATH``.
    """
    data = json.dumps(seccomp.docker_profile(allow_inet=allow_inet), sort_keys=True).encode()
    folder = os.path.join(tempfile.gettempdir(), f"arborl-seccomp-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    # /tmp is shared: refuse a folder someone else made (or a link), where the file could be swapped.
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SandboxError(f"{folder} is not a private directory of this user (mode 0700); remove it")
    path = os.path.join(folder, hashlib.sha256(data).hexdigest()[:16] + ".json")
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)  # atomic: a concurrent backend never reads a half-written profile
    return path


def _feed(stream: object, payload: bytes) -> None:
    try:
        stream.write(payload)  # type: ignore[attr-defined]
        stream.close()  # type: ignore[attr-defined]
    except (BrokenPipeError, OSError):
        pass  # the runner exits without reading unread stdin: normal


if __name__ == "__main__":  # `python -m arborl.sandbox.docker build-image|clean`
    if sys.argv[1:] == ["build-image"]:
        print(ensure_image())
    elif sys.argv[1:] == ["clean"]:
        print(f"removed {remove_leftovers()} containers")
    else:
        sys.exit("usage: python -m arborl.sandbox.docker build-image|clean")
