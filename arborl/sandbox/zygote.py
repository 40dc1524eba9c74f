"""The fast path for many short snippets: a pool of warm, pre-forked interpreters.

Each worker is one :mod:`arborl.sandbox.zygote_server` process: Debian's ``/usr/bin/python3``
with the common modules already imported, running as root inside a bwrap that gives it its own
mount namespace (the same read-only system binds as the ``bwrap`` backend, nothing else of the
host), an empty network namespace, and its own pid/ipc/uts namespaces. For every request it
forks a child into fresh pid/mount/ipc/uts namespaces (and, with a proxy, a fresh network
namespace) that drops to a uid of its own (from a few leased per worker,
:mod:`arborl.sandbox.uids`) and makes itself non-dumpable before the snippet runs; two such
children are forked and fully jailed *ahead* of their requests (they hold nothing of any request
until one is handed to them), so a request only pays for handing over its fds.

What it isolates (the same probes as ``bwrap`` pass):

- **Environment:** the zygote starts with a cleared environment and never receives secrets; the
  request (code, files, stdin) is read only by the forked child, so the zygote's memory, which
  later children inherit, holds no other run's data.
- **Files:** only the read-only system binds; per-request size-capped tmpfs ``/tmp`` and
  ``/dev/shm``; a fresh ``/proc`` showing only the request's own processes.
- **Network:** loopback only; optional proxy relay as in ``bwrap``. With a proxy (the only case
  in which the seccomp filter lets a snippet open inet sockets) every request has a network
  namespace of its own, so no socket state such as a TIME_WAIT reaches a later request; without
  one, requests of a worker share its empty namespace, where no inet socket can be opened.
- **Processes / orphans:** the snippet is pid 1 of a new pid namespace; when it exits or is
  killed at the deadline, every descendant dies with it. Per-request memory + pids cgroups.
- **Privileges:** a uid/gid no other live sandbox holds, no capabilities, ``no_new_privs``, a
  non-dumpable process, the seccomp filter (which also refuses nested user namespaces, since
  this bwrap runs without a user namespace, and io_uring).

What it does not isolate: everything ``bwrap`` does not (the kernel, CPU share); in addition the
zygote itself runs as **root** (with capabilities, confined to its namespaces) -- the snippet
never runs in it, but a bug in the fork/drop sequence would matter more than in ``bwrap``. The
snippet is pid 1 of its namespace, so signals it sends to itself with a default action (e.g.
``os.kill(os.getpid(), SIGTERM)``) are ignored by the kernel, and the CPU limit ends it by SIGKILL
rather than SIGXCPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

from arborl.sandbox import cgroup as cgroups
from arborl.sandbox import common, seccomp, uids
from arborl.sandbox.base import ExecResult, Limits, SandboxError
from arborl.sandbox.bwrap import BWRAP, BwrapBackend, _system_binds
from arborl.sandbox.output import collect
from arborl.sandbox.zygote_server import UIDS_PER_WORKER, recv_exact

# Imported once in every worker so snippets do not pay for them (and so lazy imports never need
# paths that nobody cannot read).
DEFAULT_PRELOAD = (
    "json", "re", "math", "random", "collections", "itertools", "functools", "string", "traceback",
    "types", "dataclasses", "typing", "decimal", "fractions", "statistics", "heapq", "bisect",
    "datetime", "textwrap", "encodings.idna", "threading", "atexit", "socketserver", "selectors",
    "numpy",
)  # fmt: skip
_START_TIMEOUT_S = 20.0
_HOST_GRACE_S = 0.3  # the zygote enforces the deadline; the host kills the worker this much later


def _recv_msg(sock: socket.socket, timeout: float) -> dict:
    sock.settimeout(timeout)
    try:
        head = recv_exact(sock, 8)
        return json.loads(recv_exact(sock, struct.unpack("!Q", head)[0]))
    finally:
        sock.settimeout(None)


class _WorkerGone(SandboxError):
    """The worker died between requests (nothing of the run started); retry on a fresh one."""


class _Worker:
    """One zygote process, its socket and its cgroups."""

    def __init__(self, limits: Limits, bpf: bytes, proxy: str | None, preload: tuple[str, ...]) -> None:
        self.limits = limits
        # The runners' uids: each live runner has one to itself (see zygote_server).
        self.uids: list[uids.UidLease] = []
        factory = cgroups.detect()
        # The worker's own group bounds zygote + request; each request gets a tighter subgroup.
        self.cg = factory.create(memory_mb=limits.memory_mb + 512, pids=limits.pids + 64) if factory else None
        try:
            self.uids = [uids.lease() for _ in range(UIDS_PER_WORKER)]
            self._start(bpf, proxy, preload)
        except BaseException:
            self.close()
            raise

    def _start(self, bpf: bytes, proxy: str | None, preload: tuple[str, ...]) -> None:
        zygote_dirs: list[str] = []
        argv = [
            BWRAP, "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-pid",
            "--unshare-cgroup-try", "--new-session", "--die-with-parent", "--clearenv", "--cap-add", "ALL",
            "--hostname", "sandbox", *_system_binds(), "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--dir", "/run/arborl/cg", "--chdir", "/tmp",
        ]  # fmt: skip
        if self.cg is not None:
            for i, d in enumerate(self.cg.dirs):
                if self.cg.version == 2:
                    Path(d, "cgroup.subtree_control").write_text("+memory +pids")
                zygote_dirs.append(os.path.join(d, "zygote"))
                os.mkdir(zygote_dirs[-1])
                argv += ["--bind", d, f"/run/arborl/cg/{i}"]
        if proxy is not None:
            argv += ["--dir", "/run/arborl", "--bind", proxy, common.PROXY_SOCKET_IN_SANDBOX]
        for key, value in {**common.SANDBOX_ENV, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}.items():
            argv += ["--setenv", key, value]
        argv += ["--remount-ro", "/"]
        server_src = (Path(__file__).parent / "zygote_server.py").read_text()
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Runners' sockets arrive on their own channel, so that collect() can take any traffic
        # on self.sock as the reply.
        self.runners, runners_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv += ["--", common.SYSTEM_PYTHON, "-I", "-B", "-c", server_src, str(child.fileno()),
                 str(runners_child.fileno())]  # fmt: skip
        procs = [os.path.join(z, "cgroup.procs") for z in zygote_dirs]
        # The zygote's own stderr (never the snippet's) goes to an unlinked file, quoted on failure.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
                env={"PATH": "/usr/bin:/bin"}, preexec_fn=common.make_preexec_join(procs),
                start_new_session=True, pass_fds=(child.fileno(), runners_child.fileno()), cwd="/",
            )  # fmt: skip
        finally:
            child.close()
            runners_child.close()
        config = {
            "launcher_src": common.launcher_source(), "bpf": bpf, "preload": list(preload),
            "cg_count": len(zygote_dirs), "cg_version": self.cg.version if self.cg else 0,
            "memory_mb": self.limits.memory_mb, "pids": self.limits.pids,
            "disk_mb": self.limits.disk_mb, "wall_s": self.limits.wall_s, "cpu_s": self.limits.cpu_s,
            "netns_per_run": proxy is not None,  # only then can a snippet open inet sockets
            "uids": [lease.uid for lease in self.uids],
        }  # fmt: skip
        data = pickle.dumps(config)
        self.sock.sendall(struct.pack("!Q", len(data)) + data)
        try:
            _recv_msg(self.sock, _START_TIMEOUT_S)
        except (OSError, EOFError, ValueError) as exc:
            raise SandboxError(f"zygote worker did not start ({exc!r}): {self.log_tail()}") from exc

    def run(self, request: bytes, stdin: bytes) -> tuple[ExecResult, bool]:
        """Run one request; return the result and whether the worker is still usable."""
        start = time.monotonic()
        payload = common.new_memfd("arborl-request", request)
        stdin_fd = common.new_memfd("arborl-stdin", stdin)  # filled here: RLIMIT_FSIZE binds the runner
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid, runner = self._next_runner()
            try:
                socket.send_fds(runner, [b"REQUEST\0"], [out_w, err_w, payload, stdin_fd])
                self.sock.sendall(b"START\0\0\0" + struct.pack("!Q", pid))
            except OSError as exc:
                raise _WorkerGone(f"zygote worker is gone ({exc})") from exc
            finally:
                runner.close()
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            for fd in (payload, stdin_fd, out_w, err_w):
                os.close(fd)
        try:
            cap = collect([out_r, err_r], self.sock.fileno(), cap=self.limits.output_bytes,
                          deadline=start + self.limits.wall_s + _HOST_GRACE_S, on_deadline=self.kill)  # fmt: skip
            reply: dict = {}
            if cap.done and not cap.timed_out:
                with contextlib.suppress(OSError, EOFError, ValueError):
                    reply = _recv_msg(self.sock, 1.0)
        finally:
            os.close(out_r)
            os.close(err_r)
        healthy = bool(reply) and not cap.timed_out
        code = reply.get("exit_code")
        stderr = cap.text(err_r)
        error = reply.get("error")
        if code == 125 and "arborl-zygote: sandbox setup failed" in stderr:
            error = error or stderr.strip().splitlines()[-1]
        if not reply and not cap.timed_out:
            error = error or f"zygote worker died during the run: {self.log_tail()}"
        timed_out = cap.timed_out or bool(reply.get("timed_out"))
        memory = bool(reply.get("memory_exceeded")) or (
            self.cg is None and stderr.rstrip().endswith("MemoryError")
        )
        result = ExecResult(
            ok=code == 0 and not (timed_out or memory or error),
            exit_code=code if reply else -signal.SIGKILL,
            stdout=cap.text(out_r), stderr=stderr, timed_out=timed_out, memory_exceeded=memory,
            output_truncated=cap.truncated, duration_s=time.monotonic() - start, backend="zygote", error=error,
        )  # fmt: skip
        return result, healthy

    def _next_runner(self) -> tuple[int, socket.socket]:
        """The next runner the zygote has forked and jailed: its pid and its socket."""
        self.runners.settimeout(_START_TIMEOUT_S)
        try:
            msg, fds, _, _ = socket.recv_fds(self.runners, 8, 1)
        except OSError as exc:
            raise _WorkerGone(f"zygote worker is gone ({exc})") from exc
        finally:
            self.runners.settimeout(None)
        if len(msg) != 8 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise _WorkerGone(f"zygote worker is gone (runner message {msg!r}): {self.log_tail()}")
        return struct.unpack("!Q", msg)[0], socket.socket(fileno=fds[0])

    def log_tail(self, n: int = 1500) -> str:
        """The end of the zygote's own stderr (for error messages)."""
        try:
            self.log.seek(0, os.SEEK_END)
            self.log.seek(max(0, self.log.tell() - n))
            return self.log.read().decode(errors="replace").strip() or "(no output)"
        except (AttributeError, OSError):
            return "(no log)"

    def kill(self) -> None:
        """Kill the whole worker: bwrap, the zygote, and every request process."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2.0)
        if self.cg is not None:
            for d in self.cg.dirs:
                for sub in sorted(Path(d).iterdir()):
                    if sub.is_dir():
                        cgroups.RunCgroup(dirs=[str(sub)], version=self.cg.version).remove()

    def close(self) -> None:
        """Stop the worker and remove its cgroups."""
        self.kill()
        with contextlib.suppress(AttributeError, OSError):
            self.sock.close()
        with contextlib.suppress(AttributeError, OSError):
            self.runners.close()
        with contextlib.suppress(AttributeError, OSError):
            self.log.close()
        if self.cg is not None:
            self.cg.remove()
        for lease in self.uids:  # every runner is dead with the worker (and its cgroups) by now
            lease.release(kill=self.cg is None)


class ZygoteBackend:
    """A pool of warm zygotes, one request at a time each (see the module docstring)."""

    name: ClassVar[str] = "zygote"
    guarantees: ClassVar[frozenset[str]] = BwrapBackend.guarantees

    @classmethod
    def probe(cls) -> str | None:
        """``None`` if the zygote can run here (it has the same needs as the bwrap backend)."""
        return BwrapBackend.probe()

    def __init__(
        self,
        limits: Limits,
        *,
        proxy_socket: str | None = None,
        max_workers: int | None = None,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
    ) -> None:
        """Start one warm worker now; more start on demand, up to ``max_workers``.

        Args:
            limits: Resource limits applied to every run.
            proxy_socket: Host path of the proxy's unix socket (mode 0666), or ``None``.
            max_workers: Concurrent runs (default: ``max(4, cpu count)``).
            preload: Modules each worker imports once (missing ones are skipped).
        """
        reason = self.probe()
        if reason is not None:
            raise SandboxError(f"zygote backend unavailable: {reason}")
        self.limits = limits
        self.proxy_socket = common.check_proxy_socket(proxy_socket)
        self._bpf = seccomp.build_bpf(allow_inet=self.proxy_socket is not None)
        self._preload = preload
        self._max = max_workers or max(4, os.cpu_count() or 1)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._closed = False
        self._count = 1
        # bwrap's --die-with-parent fires when the *thread* that spawned it exits, so every worker
        # is spawned from this one long-lived thread, never from a caller's short-lived thread.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arborl-zygote-spawner")
        self._release(self._new_worker())

    def _new_worker(self) -> _Worker:
        return self._spawner.submit(
            _Worker, self.limits, self._bpf, self.proxy_socket, self._preload
        ).result()

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the zygote backend is closed")
                if self._idle:
                    return self._idle.pop()
                if self._count < self._max:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return self._new_worker()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker, healthy: bool = True) -> None:
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._count -= 1
            self._cond.notify()
        worker.close()

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run one snippet in a fresh child of a warm worker."""
        request = common.make_request(code, files, common.PROXY_SOCKET_IN_SANDBOX if self.proxy_socket else None)
        data = common.stdin_bytes(stdin)
        for attempt in range(2):
            worker = self._acquire()
            healthy = False
            try:
                result, healthy = worker.run(request, data)
                return result
            except _WorkerGone:
                if attempt:
                    raise
            finally:
                self._release(worker, healthy)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop every worker."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for worker in idle:
            worker.close()
        self._spawner.shutdown(wait=False)
