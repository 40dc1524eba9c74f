"""WASI sandbox backend: CPython compiled to WebAssembly, run by wasmtime.

What it isolates. The snippet runs inside a wasm instance: it has no syscalls, only the WASI
calls wasmtime implements for it. No sockets (none are granted), no processes (WASI has no fork
or exec), no host environment (the WASI env is empty), no host files except one preopened scratch
directory. Memory is capped by wasmtime's store limits (linear memory), CPU time by epoch
interruption (a trap at the deadline), wall time by killing the run's process.

How a run executes. Each backend keeps a small pool of worker processes that hold the compiled
module; a run takes an idle worker, which creates a new ``Store`` and instance for it (nothing of
one run's wasm state reaches the next). A run that blocks in a host call (``time.sleep`` is a
blocking WASI ``poll_oneoff`` that no trap can interrupt) is stopped by SIGKILL of its worker at
the wall deadline, and the worker is replaced in the background; the caller's process never
runs wasm itself. The run's stdout/stderr are pipes the caller reads with a byte cap, draining
the rest. A run that finds no idle worker starts one; after such a burst, the workers beyond
``idle_size`` are stopped once idle for ``shrink_after_s`` (:class:`~arborl.sandbox.pool.IdlePool`).

Disk. WASI has no quota of its own, so the scratch directory is a tmpfs of ``limits.disk_mb``
(and a matching inode cap): a real cap. Each worker mounts its own in a private mount namespace
(invisible to the host, gone with the worker), then drops for good to a uid/gid leased for that
worker (:mod:`arborl.sandbox.uids`: no other sandbox, of any backend, runs as it), and empties
the scratch after every run, iteratively (:func:`arborl.sandbox.scratch.wipe`: a tree thousands
of levels deep or without permissions is removed too); a worker whose scratch cannot be emptied
is replaced. WASI has no IPC and no sockets, so nothing else outlives a run. Mounting
needs root (CAP_SYS_ADMIN); without it the scratch is preopened read-only (the snippet reads the
files it is given and can write nothing), which also keeps the cap, and the workers keep the
caller's uid. :attr:`WasmBackend.writable` says which mode is in use. If the backend's process
dies without ``close()``, its workers exit within ~0.1 s and remove their files; only empty
directories remain in the temp dir.

What it does NOT isolate: the wasmtime runtime itself is the boundary (a wasmtime bug escapes,
as the worker's uid in the writable mode, as the caller in the read-only mode); CPU time is bounded
only through the epoch deadline, which counts wall time (``min(cpu_s, wall_s)``); timing side
channels are open. The interpreter is the WebAssembly Language Runtimes build of
CPython 3.12.0 (stdlib embedded): no ``ssl``, ``ctypes``, threads or C extensions such as numpy.

The compiled module is cached (``Module.serialize``) in the arborl cache directory, keyed by the
wasm's sha256 and the wasmtime version, so only the first construction on a machine pays the
7-11 s compile.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import ClassVar

from arborl.sandbox import _wasm_runtime as rt
from arborl.sandbox import uids
from arborl.sandbox.base import ExecResult, Limits, SandboxError
from arborl.sandbox.common import validate_files
from arborl.sandbox.output import read_capped
from arborl.sandbox.pool import IdlePool

_MIN_MEMORY_MB = 16
_GRACE_S = 0.5  # after the wall deadline before SIGKILL; the epoch trap normally fires first


class WasmBackend:
    """Runs snippets with CPython-on-WASI (see the module docstring for the threat model).

    Args:
        limits: Per-run limits; ``pids`` does not apply (WASI cannot create processes).
        proxy_socket: Must be ``None``: WASI has no network at all.
        wasm_path: ``python.wasm`` to run; default :func:`~arborl.sandbox._wasm_runtime.locate_python_wasm`.
        writable: Force the scratch mode; default: writable tmpfs if this process can mount one.
        pool_size: Number of workers started up front and kept warm.
        idle_size: How many idle workers to keep after a burst of concurrent runs has started
            more (default ``pool_size``): those beyond it are stopped once idle for ``shrink_after_s``.
        shrink_after_s: How long a worker beyond ``idle_size`` may stay idle.
    """

    name: ClassVar[str] = "wasm"
    # Every property of the threat suite (tests/sandbox); see the module docstring for how.
    guarantees: ClassVar[frozenset[str]] = frozenset(
        {"env", "host_files", "network", "pids", "memory", "disk", "cpu", "orphans", "privileges", "cross_run"}
    )

    def __init__(self, limits: Limits, *, proxy_socket: str | None = None, wasm_path: str | None = None,
                 writable: bool | None = None, pool_size: int = 2, idle_size: int | None = None,
                 shrink_after_s: float = 10.0) -> None:
        if proxy_socket is not None:
            raise SandboxError("the wasm backend has no network at all, so it cannot use proxy_socket; "
                               "use the bwrap or docker backend for runs that need the proxy")
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self._idle: IdlePool[_Worker] = IdlePool(
            self._discard, idle_size=pool_size if idle_size is None else idle_size, shrink_after_s=shrink_after_s)
        if limits.memory_mb < _MIN_MEMORY_MB:
            raise SandboxError(f"the wasm backend needs Limits.memory_mb >= {_MIN_MEMORY_MB} (CPython's initial "
                               f"wasm heap is 10 MiB), got {limits.memory_mb}; raise memory_mb")
        if wasm_path is None and (reason := self.probe()) is not None:
            raise SandboxError(reason)
        self.limits = limits
        self.writable = rt.can_mount_tmpfs() if writable is None else writable
        if self.writable and not rt.can_mount_tmpfs():
            raise SandboxError("writable=True needs root (CAP_SYS_ADMIN) to mount the size-capped scratch tmpfs")
        self._wasm = wasm_path or rt.locate_python_wasm()
        self._cwasm = rt.compiled_module(self._wasm)  # compiles once per machine, then cached
        self._dir = tempfile.mkdtemp(prefix="arborl-wasm-")
        if self.writable:
            os.chmod(self._dir, 0o711)  # workers drop to sandbox uids: traverse, but not list
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(pool_size):
            self._idle.put(self._spawn())

    @classmethod
    def probe(cls) -> str | None:
        """``None`` if wasmtime imports and ``python.wasm`` is present, else the reason and the fix."""
        try:
            import wasmtime  # noqa: F401
        except ImportError:
            return "the wasmtime package is missing; pip install 'arborl[sandbox]' (or scripts/setup/wasm.sh)"
        try:
            rt.locate_python_wasm()
        except SandboxError as exc:
            return str(exc)
        return None

    def _spawn(self) -> _Worker:
        lease = uids.lease() if self.writable else None  # read-only mode: workers keep our uid
        try:
            w = _Worker([self._cwasm, str(self.limits.memory_mb), str(self.limits.disk_mb), str(int(self.writable)),
                         self._dir, str(lease.uid if lease else os.getuid())], lease)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        with self._lock:
            self._workers.add(w)
        return w

    def _discard(self, w: _Worker) -> None:
        """Kill a worker and forget it."""
        w.kill()
        with self._lock:
            self._workers.discard(w)

    def _retire(self, w: _Worker) -> None:
        """Kill a worker whose state is unknown; start its replacement in the background."""
        self._discard(w)

        def refill() -> None:
            with contextlib.suppress(SandboxError):
                new = self._spawn()
                if self._closed:
                    new.kill()
                else:
                    self._idle.put(new)
        if not self._closed:
            threading.Thread(target=refill, daemon=True).start()

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run ``code`` in a fresh wasm instance on a fresh scratch dir; see :class:`ExecResult`."""
        if self._closed:
            raise SandboxError("WasmBackend is closed; create a new one")
        t0 = time.monotonic()
        req = {"code": code, "stdin": stdin, "wall_s": self.limits.wall_s, "cpu_s": self.limits.cpu_s,
               "files": [[name, base64.b64encode(data).decode()] for name, data in validate_files(files).items()]}
        res = self._run(req)
        res.duration_s = time.monotonic() - t0
        return res

    def _run(self, req: dict[str, object]) -> ExecResult:
        w = self._idle.get(timeout=1.0) or self._spawn()  # none idle: concurrent callers, or being replaced
        cap = self.limits.output_bytes
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        bufs, total = [bytearray(), bytearray()], [0, 0]

        def read(i: int, fd: int) -> None:
            try:
                total[i] = read_capped(fd, bufs[i], cap)
            finally:
                os.close(fd)
        readers = [threading.Thread(target=read, args=(i, fd), daemon=True) for i, fd in enumerate((out_r, err_r))]
        for t in readers:
            t.start()
        killed, status = False, None
        try:
            rt.send_request(w.sock, req, [out_w, err_w])
            w.sock.settimeout(self.limits.wall_s + _GRACE_S)
            status = json.loads(rt.recv_line(w.sock))
        except (TimeoutError, OSError, EOFError, ValueError) as exc:
            killed = isinstance(exc, TimeoutError)
            if not killed:
                status = {"error": f"wasm worker died: {exc!r}"}
        finally:
            os.close(out_w)
            os.close(err_w)
        if killed or status is None or status.get("unclean") or str(status.get("error", "")).startswith("wasm worker died"):
            self._retire(w)  # its pipes close with it, so the readers below finish
        else:
            self._idle.put(w)
        for t in readers:
            t.join(timeout=2.0)
        return self._result(status, bufs, total, killed)

    def _result(self, status: dict[str, object] | None, bufs: list[bytearray], total: list[int],
                killed: bool) -> ExecResult:
        stdout, stderr = (b.decode("utf-8", "replace") for b in bufs)
        truncated = any(n > self.limits.output_bytes for n in total)
        if killed or status is None:
            return ExecResult(ok=False, exit_code=-9, stdout=stdout, stderr=stderr, timed_out=killed,
                              output_truncated=truncated, backend=self.name,
                              error=None if killed else "wasm run died without a status")
        if "error" in status:
            return ExecResult(ok=False, exit_code=None, stdout=stdout, stderr=stderr, backend=self.name,
                              output_truncated=truncated, error=str(status["error"]))
        code = int(status["exit"])  # type: ignore[call-overload]
        trap = str(status.get("trap") or "")
        timed_out = "interrupt" in trap
        # Linear memory at the store limit and a failed run, or CPython's own MemoryError.
        memory = (bool(status.get("memory_full")) and (code != 0 or bool(trap))) or (
            code == 1 and "MemoryError" in stderr[-2000:])
        if trap and not timed_out:
            stderr += f"\n[wasm trap] {trap}\n"
        return ExecResult(ok=code == 0 and not trap and not memory, exit_code=code, stdout=stdout,
                          stderr=stderr, timed_out=timed_out, memory_exceeded=memory,
                          output_truncated=truncated, backend=self.name)

    def close(self) -> None:
        """Kill every worker and remove the private directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._idle.close()
        with self._lock:
            workers = list(self._workers)
            self._workers.clear()
        for w in workers:
            w.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> WasmBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _Worker:
    """One worker process (:func:`~arborl.sandbox._wasm_runtime.worker`) and its socket."""

    def __init__(self, args: list[str], lease: uids.UidLease | None) -> None:
        self.lease = lease
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from arborl.sandbox._wasm_runtime import worker; worker(sys.argv[1:])",
             str(theirs.fileno()), *args],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, env={"PYTHONPATH": os.pathsep.join(sys.path), "PATH": "/usr/bin:/bin"})
        theirs.close()
        self.sock.settimeout(60.0)
        try:
            ready = rt.recv_line(self.sock)
        except (EOFError, OSError) as exc:
            self.kill()
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise SandboxError(f"wasm worker failed to start ({exc!r}): {err[-800:]}") from exc
        if b"ready" not in ready:
            self.kill()
            raise SandboxError(f"wasm worker sent {ready[:200]!r} instead of ready")
        if self.proc.stderr:
            self.proc.stderr.close()  # from here on errors come back on the socket

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.sock.close()
        if self.lease is not None:
            self.lease.release()


if __name__ == "__main__":  # `python -m arborl.sandbox.wasm fetch`: download python.wasm, compile
    if sys.argv[1:] == ["fetch"]:
        path = rt.fetch_python_wasm()
        print(path)
        print(rt.compiled_module(path))
    else:
        sys.exit("usage: python -m arborl.sandbox.wasm fetch")
