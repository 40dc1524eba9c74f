"""The default backend: one bubblewrap sandbox per run, as a uid of its own, with seccomp and cgroups.

Each call gets its own ``bwrap``, started as a host uid leased for this one sandbox
(:mod:`arborl.sandbox.uids`; its user namespace maps that uid to 65534 inside, so the snippet
still sees ``nobody``) with ``--unshare-all --unshare-user --disable-userns --new-session
--die-with-parent --clearenv``, running Debian's ``/usr/bin/python3 -I -S`` on
:mod:`arborl.sandbox.launcher`; everything is torn down before the call returns.

A few sandboxes (``spares``, default 2) are started *before* their request: bwrap has built the
namespaces, mounts and seccomp filter, the process is in its own fresh cgroup as uid 65534, and
the interpreter waits on a pipe. A call takes one, writes its request and stdin into the
sandbox's two memfds, and a replacement starts in the background. Each sandbox still serves exactly one run, so the
isolation is that of a sandbox started on demand; only the start-up (25-60 ms of a cold run on
the loaded reference VM) leaves the caller's path. The interpreter's start-up CPU time (a few
ms) counts against RLIMIT_CPU, and an idle spare holds ~12 MB of memory.

What it isolates:

- **Environment:** the parent's environment never reaches the sandbox (bwrap itself is started
  with a two-variable environment, the snippet sees only ``PATH HOME TMPDIR LANG USER``).
- **Files:** a fresh root with read-only binds of ``/usr`` (and the ``/bin /lib /lib64 /sbin``
  symlinks), ``/etc/ld.so.cache``, ``/etc/localtime``, ``/etc/ssl``, ``/etc/ca-certificates``;
  nothing else of the host (no ``/root``, ``/home``, ``/work``, project tree, docker socket).
  Writable: only a size-capped tmpfs ``/tmp`` (the scratch and cwd) and a size-capped
  ``/dev/shm``, each of ``Limits.disk_mb`` (tmpfs pages also count against the memory cgroup);
  the sandbox's own root and ``/dev`` are remounted read-only.
- **Network:** a new, empty network namespace (loopback only); no DNS. With ``proxy_socket``, the
  proxy's unix socket is bind-mounted at ``/run/arborl/proxy.sock`` and a relay on
  ``127.0.0.1:3128`` forwards to it (``HTTP(S)_PROXY`` are set).
- **Processes:** new pid/ipc/uts/cgroup namespaces; bwrap's pid 1 takes every descendant with it;
  a per-run memory + pids cgroup (v1 or v2) is killed and removed after each call.
- **Other runs:** every sandbox (a spare too) has a host uid no other sandbox holds meanwhile,
  and its interpreter is non-dumpable, so no other run (of any backend) can signal its
  processes or open its ``/proc/PID/root``, and its user namespace is owned by its own uid.
- **Privileges:** no capabilities, ``no_new_privs``, nested user namespaces refused, and the
  seccomp filter of :mod:`arborl.sandbox.seccomp`. ``--new-session`` blocks TIOCSTI injection.
- **CPU / output:** RLIMIT_CPU, a wall deadline, and capped reads of stdout/stderr.

What it does not isolate: the host kernel (a kernel bug is an escape), CPU share (no CPU quota;
a snippet may use whole cores until its deadline), the readable system files under ``/usr``
(anything installed there, e.g. ``/usr/local``, is visible), and the machine's load (a run can
still slow its neighbours). The interpreter is Debian's system Python because the usual
development interpreter (pyenv under ``/root``, mode 700) is unreadable to ``nobody``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

from arborl.sandbox import cgroup as cgroups
from arborl.sandbox import common, seccomp, uids
from arborl.sandbox.base import ExecResult, Limits, SandboxError

BWRAP = "/usr/bin/bwrap"
INSTALL_HINT = "apt-get install -y bubblewrap libseccomp2 python3 && pip install pyseccomp==0.1.2"


def _system_binds() -> list[str]:
    """Read-only binds of the system tree: symlinks where the host has symlinks (usrmerge)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in (
        "/etc/ld.so.cache",
        "/etc/localtime",
        "/etc/ssl",
        "/etc/ca-certificates",
        "/etc/alternatives",
    ):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


class BwrapBackend:
    """One bubblewrap sandbox per run (see the module docstring for the threat model)."""

    name: ClassVar[str] = "bwrap"
    guarantees: ClassVar[frozenset[str]] = frozenset(
        {
            "env",
            "host_files",
            "network",
            "pids",
            "memory",
            "disk",
            "cpu",
            "orphans",
            "privileges",
            "cross_run",
        }
    )

    @classmethod
    def probe(cls) -> str | None:
        """``None`` if bwrap, root, Debian's python3 and libseccomp all work here."""
        if shutil.which("bwrap") is None or not os.path.exists(BWRAP):
            return f"bubblewrap is not installed: {INSTALL_HINT}"
        if not os.path.exists(common.SYSTEM_PYTHON):
            return f"{common.SYSTEM_PYTHON} is missing (the sandbox needs a world-readable Python): {INSTALL_HINT}"
        if os.geteuid() != 0:
            return "the bwrap backend must run as root (it starts bwrap as uid 65534 and creates cgroups)"
        if not os.path.exists("/proc/self/ns/user"):
            return "the kernel has no user namespaces (CONFIG_USER_NS)"
        return seccomp.probe()

    def __init__(self, limits: Limits, *, proxy_socket: str | None = None, spares: int = 2) -> None:
        """Prepare the fixed part of the bwrap command line and start the spare sandboxes.

        Args:
            limits: Resource limits applied to every run.
            proxy_socket: Host path of the filtering proxy's unix socket (mode 0666), or ``None``
                for no network at all.
            spares: Sandboxes kept started ahead of their request (each one is used for exactly
                one run); ``0`` starts every sandbox on the caller's request.
        """
        if not isinstance(spares, int) or spares < 0:
            raise ValueError(f"spares must be an int >= 0, got {spares!r}")
        reason = self.probe()
        if reason is not None:
            raise SandboxError(f"bwrap backend unavailable: {reason}")
        self.limits = limits
        self.proxy_socket = common.check_proxy_socket(proxy_socket)
        self._bpf = seccomp.build_bpf(allow_inet=self.proxy_socket is not None)
        self._argv_head = self._static_args()
        cgroups.detect()  # probe the cgroup layout once, outside the timed path
        self._lock = threading.Lock()
        self._closed = False
        # Spares are spawned from this one long-lived thread: bwrap's --die-with-parent fires
        # when the *thread* that spawned it exits. The same thread removes used cgroups.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arborl-bwrap-spawner")
        self._spares: collections.deque[Future[_Spare]] = collections.deque(
            self._spawner.submit(self._start_sandbox) for _ in range(spares)
        )

    def _static_args(self) -> list[str]:
        size = str(self.limits.disk_mb << 20)
        args = [
            BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--new-session",
            "--die-with-parent", "--clearenv", "--hostname", "sandbox",
            # The host uid is the sandbox's own (leased); inside, the snippet is 65534 as always.
            "--uid", "65534", "--gid", "65534",
            *_system_binds(),
            "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/tmp",
            "--size", size, "--tmpfs", "/dev/shm",
            "--chdir", "/tmp",
        ]  # fmt: skip
        for key, value in common.SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        if self.proxy_socket is not None:
            args += ["--dir", "/run/arborl", "--bind", self.proxy_socket, common.PROXY_SOCKET_IN_SANDBOX]
        # bwrap's root and /dev are tmpfs owned by the sandbox user: without this a snippet could
        # fill memory through /etc or /dev, outside the size-capped scratch.
        return [*args, "--remount-ro", "/", "--remount-ro", "/dev"]

    def _start_sandbox(self) -> _Spare:
        """Start one sandbox whose interpreter waits for its request (see :class:`_Spare`)."""
        lease = uids.lease()
        payload_fd = os.memfd_create("arborl-request")
        stdin_fd = os.memfd_create("arborl-stdin")
        go_r, go_w = os.pipe()
        bpf_fd = seccomp.bpf_fd(self._bpf)
        try:
            argv = [*self._argv_head, "--seccomp", str(bpf_fd), "--", common.SYSTEM_PYTHON, "-I", "-S", "-B",
                    "-c", common.launcher_source(), str(payload_fd), str(stdin_fd), str(go_r)]  # fmt: skip
            proc, cg = common.spawn(
                argv,
                limits=self.limits,
                backend=self.name,
                uid=lease.uid,
                pass_fds=(payload_fd, stdin_fd, bpf_fd, go_r),
                via_bwrap=True,
            )
        except BaseException:
            for fd in (payload_fd, stdin_fd, go_w):
                os.close(fd)
            lease.release()
            raise
        finally:
            os.close(go_r)
            os.close(bpf_fd)
        return _Spare(proc, cg, lease, payload_fd, stdin_fd, go_w)

    def _take(self) -> _Spare:
        """A started sandbox: a spare if one is (being) started, else a new one; refill the spares."""
        with self._lock:
            if self._closed:
                raise SandboxError("the bwrap backend is closed")
            pending = self._spares.popleft() if self._spares else None
            if pending is not None:
                self._spares.append(self._spawner.submit(self._start_sandbox))
        if pending is not None:
            try:
                return pending.result()
            except SandboxError:
                pass  # the spare could not start; try once more here, reporting that error
        return self._start_sandbox()

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run one snippet in a fresh sandbox.

        Args:
            code: Python source, run as ``__main__`` from ``/tmp/main.py``.
            stdin: Text (or bytes) served on standard input.
            files: ``{relative path: bytes}`` written into the scratch directory first.

        Returns:
            The run's result; limits hit are fields of it, never exceptions.
        """
        request = common.make_request(code, files, common.PROXY_SOCKET_IN_SANDBOX if self.proxy_socket else None)
        data = common.stdin_bytes(stdin)
        sandbox = self._take()
        start = time.monotonic()
        try:
            if sandbox.proc.poll() is not None or not sandbox.hand_over(request, data):
                sandbox.discard()  # it died before its request (killed from outside): use a new one
                sandbox = self._start_sandbox()
                if not sandbox.hand_over(request, data):
                    reason = sandbox.stderr_tail()
                    sandbox.discard()
                    raise SandboxError(f"bwrap: the sandbox died before its run: {reason}")
            return common.supervise(sandbox.proc, sandbox.cg, self.limits, self.name, start, via_bwrap=True)
        finally:
            sandbox.close_memfds()
            # supervise() already killed everything in it; the rmdir need not delay the caller.
            self._cleanup(sandbox)

    def _cleanup(self, sandbox: _Spare) -> None:
        try:
            self._spawner.submit(sandbox.release)
        except RuntimeError:  # executor shut down (backend closed meanwhile)
            sandbox.release()

    def close(self) -> None:
        """Stop the spare sandboxes (they never ran anything) and remove their cgroups."""
        with self._lock:
            self._closed = True
            pending, self._spares = list(self._spares), collections.deque()
        for fut in pending:
            with contextlib.suppress(SandboxError):
                fut.result().discard()
        self._spawner.shutdown(wait=True)


@dataclass
class _Spare:
    """A bwrap sandbox started ahead of its request.

    Everything of a one-shot run except the snippet is done already: bwrap has made the
    namespaces, mounts and seccomp filter, the process joined its own fresh cgroup and dropped to
    its own leased uid, and the interpreter has started; the launcher blocks reading ``go_fd``.
    The spare is used for exactly one request, then torn down like any one-shot run.
    """

    proc: subprocess.Popen[bytes]
    cg: cgroups.RunCgroup | None
    lease: uids.UidLease
    payload_fd: int
    stdin_fd: int
    go_fd: int

    def hand_over(self, request: bytes, stdin: bytes) -> bool:
        """Put ``request`` and ``stdin`` in their memfds and wake the launcher; ``False`` if it is gone."""
        try:
            common.fill_memfd(self.payload_fd, request)
            common.fill_memfd(self.stdin_fd, stdin)  # written here: RLIMIT_FSIZE binds the sandbox only
            os.write(self.go_fd, b"G")
        except BrokenPipeError:
            return False
        finally:
            self._close_go()
        return True

    def _close_go(self) -> None:
        # Once only: a second close could hit an fd number another thread has reused meanwhile.
        if self.go_fd >= 0:
            fd, self.go_fd = self.go_fd, -1
            os.close(fd)

    def stderr_tail(self) -> str:
        """What the sandbox wrote on stderr (after it exited), for error messages."""
        assert self.proc.stderr is not None
        try:
            self.proc.wait(timeout=2.0)  # a read before bwrap's own exit would block on the pipe
        except subprocess.TimeoutExpired:
            return "(the sandbox is still running)"
        with contextlib.suppress(OSError, ValueError):
            return self.proc.stderr.read(4096).decode(errors="replace").strip() or "(no output)"
        return "(unreadable)"

    def close_memfds(self) -> None:
        """Close the request and stdin memfds (once: their numbers may be reused afterwards)."""
        for fd in (self.payload_fd, self.stdin_fd):
            if fd >= 0:
                os.close(fd)
        self.payload_fd = self.stdin_fd = -1

    def release(self) -> None:
        """After the run: remove its cgroup (killing what is left), then give its uid back."""
        if self.cg is not None:
            self.cg.remove()
        # Without a cgroup only the pid namespace bounds the run: make sure of its uid too.
        self.lease.release(kill=self.cg is None)

    def discard(self) -> None:
        """Stop an unused spare: EOF on ``go_fd`` makes its launcher exit; then reap and clean up."""
        self._close_go()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=2.0)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.close_memfds()
        self.release()
