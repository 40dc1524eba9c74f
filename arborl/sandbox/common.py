"""Pieces shared by the one-shot backends (``bwrap``, ``process``): spawn, limit, collect, report.

:func:`run_once` is the whole life of one run: :func:`spawn` creates the run's cgroup and starts
the child with a ``preexec_fn`` that joins the cgroup, sets rlimits and drops to the run's own
uid (leased from :mod:`arborl.sandbox.uids`; in that order: the first two need root);
:func:`supervise` collects output under the deadline, then kills every descendant (process group
+ cgroup) and turns what happened into an :class:`ExecResult`. The bwrap backend calls the two
halves separately, so that it can start a sandbox before the request for it arrives.

The snippet's stdin is served from a memfd that the parent fills (:func:`fill_memfd`), never
written inside the sandbox: RLIMIT_FSIZE (``disk_mb``) would cut it there.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import math
import os
import resource
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from arborl.sandbox import cgroup as cgroups
from arborl.sandbox import uids
from arborl.sandbox.base import ExecResult, Limits, SandboxError
from arborl.sandbox.output import collect

SYSTEM_PYTHON = "/usr/bin/python3"
# Where the proxy's unix socket appears inside the sandbox.
PROXY_SOCKET_IN_SANDBOX = "/run/arborl/proxy.sock"
# Tasks bwrap itself keeps in the run's pids cgroup (its monitor and its pid-1 reaper), so that
# ``Limits.pids`` counts exactly the snippet's own processes and threads (the relay thread too).
BWRAP_PIDS_OVERHEAD = 2
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "USER": "nobody",
}

_PKG = Path(__file__).resolve().parent


@functools.cache
def launcher_source() -> str:
    """Source text of :mod:`arborl.sandbox.launcher` (shipped into the sandbox)."""
    return (_PKG / "launcher.py").read_text()


@functools.cache
def relay_source() -> str:
    """Source text of the proxy relay (``arborl/proxy/relay.py``) shipped into the sandbox."""
    path = _PKG.parent / "proxy" / "relay.py"
    if not path.exists():
        raise SandboxError(
            f"proxy relay {path} is missing; reinstall arborl (it ships arborl/proxy/relay.py)"
        )
    return path.read_text()


def check_proxy_socket(path: str | None) -> str | None:
    """Validate a proxy socket path; return it absolute (or ``None``)."""
    if path is None:
        return None
    real = os.path.realpath(path)
    if not os.path.exists(real):
        raise SandboxError(f"proxy_socket {path!r} does not exist; start the arborl proxy first")
    if not os.stat(real).st_mode & 0o002:
        raise SandboxError(
            f"proxy_socket {path!r} is not connectable by the sandbox users (uids of "
            f"{uids.UID_RANGE.start}-{uids.UID_RANGE.stop - 1}); "
            f"make it world-writable: chmod 0666 {path}"
        )
    return real


def validate_files(files: dict[str, bytes] | None) -> dict[str, bytes]:
    """Check the caller's files: relative paths inside the scratch dir, bytes content."""
    clean: dict[str, bytes] = {}
    for name, data in (files or {}).items():
        norm = os.path.normpath(name)
        if not name or os.path.isabs(name) or norm.startswith("..") or norm in (".", "main.py"):
            raise ValueError(
                f"file name {name!r} must be a relative path inside the scratch directory "
                "(no '..', not absolute, not 'main.py' which holds the snippet)"
            )
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray):
            raise TypeError(f"file {name!r}: content must be bytes or str, got {type(data).__name__}")
        clean[norm] = bytes(data)
    return clean


def make_request(code: str, files: dict[str, bytes] | None, proxy: str | None) -> bytes:
    """Encode one request for :mod:`arborl.sandbox.launcher` (``marshal``: no import in the sandbox).

    stdin is not part of it: it travels in a memfd of its own (:func:`stdin_bytes`, :func:`fill_memfd`).

    Args:
        code: The snippet.
        files: Files for the scratch directory.
        proxy: Path of the proxy socket *as seen inside the sandbox*, or ``None``.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be str, got {type(code).__name__}")
    return marshal.dumps(
        {
            "code": code,
            "files": validate_files(files),
            "relay_src": relay_source() if proxy else None,
            "proxy_socket": proxy,
        },
        4,  # version 4: read by every Python >= 3.4, whatever the host interpreter's version
    )


def stdin_bytes(stdin: str | bytes) -> bytes:
    """The bytes of a run's stdin (``str`` is encoded as UTF-8)."""
    if isinstance(stdin, str):
        return stdin.encode()
    if isinstance(stdin, bytes | bytearray | memoryview):
        return bytes(stdin)
    raise TypeError(f"stdin must be str or bytes, got {type(stdin).__name__}")


def fill_memfd(fd: int, data: bytes) -> None:
    """Write all of ``data`` at offset 0 of ``fd`` (``pwrite``: the fd's offset stays 0 for the reader)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], done)


def new_memfd(name: str, data: bytes = b"") -> int:
    """A fresh memfd holding ``data``, read from offset 0; the caller closes it."""
    fd = os.memfd_create(name)
    try:
        fill_memfd(fd, data)
    except BaseException:
        os.close(fd)
        raise
    return fd


def rlimits(limits: Limits, *, cgroup: bool) -> list[tuple[int, tuple[int, int]]]:
    """The rlimits of a run; memory and process count only when no cgroup enforces them.

    RLIMIT_AS is a fallback only: it limits address space, not memory, and breaks runtimes that
    reserve large mappings. RLIMIT_NPROC counts every process of the run's uid on the host (one
    uid per sandbox, so it is per run); again only a fallback.
    """
    cpu = math.ceil(limits.cpu_s)
    out = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU first, SIGKILL one second later
        (resource.RLIMIT_FSIZE, (limits.disk_mb << 20, limits.disk_mb << 20)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NOFILE, (1024, 1024)),
    ]
    if not cgroup:
        mem = (limits.memory_mb + 64) << 20  # + interpreter/bwrap address-space overhead
        out += [(resource.RLIMIT_AS, (mem, mem)), (resource.RLIMIT_NPROC, (limits.pids, limits.pids))]
    return out


def make_preexec(
    procs_paths: list[str],
    limits: list[tuple[int, tuple[int, int]]],
    uid: int,
    before_drop: Callable[[], None] | None = None,
    after_drop: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """Build the child-side setup: join cgroups, set rlimits, (hook), drop to ``uid``, (hook).

    The gid is the uid, and no supplementary groups are kept.

    Only plain syscalls run in it (no locks, no imports), which keeps ``preexec_fn`` safe enough
    in a threaded parent.
    """

    def preexec() -> None:
        for path in procs_paths:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"0")  # "0" = the writing process
            os.close(fd)
        for which, value in limits:
            resource.setrlimit(which, value)
        if before_drop is not None:
            before_drop()
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if after_drop is not None:
            after_drop()

    return preexec


def make_preexec_join(procs_paths: list[str]) -> Callable[[], None]:
    """A ``preexec_fn`` that only joins cgroups (for processes that stay root, like the zygote)."""

    def preexec() -> None:
        for path in procs_paths:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)

    return preexec


def exit_status(returncode: int | None, *, via_bwrap: bool) -> int | None:
    """Normalise an exit status: negative signal numbers, also for bwrap's ``128 + sig``."""
    if returncode is None:
        return None
    if via_bwrap and 128 < returncode <= 128 + 64:
        return -(returncode - 128)
    return returncode


def spawn(
    argv: list[str],
    *,
    limits: Limits,
    backend: str,
    uid: int,
    pass_fds: tuple[int, ...] = (),
    before_drop: Callable[[], None] | None = None,
    after_drop: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    via_bwrap: bool = False,
) -> tuple[subprocess.Popen[bytes], cgroups.RunCgroup | None]:
    """Create the run's cgroup and start ``argv`` in it as ``uid`` (see :func:`run_once`).

    The cgroup also accounts CPU time, for :func:`cpu_limit_hit`: bwrap's rusage misses the
    snippet's (its monitor does not reap its pid 1).

    Returns:
        The started process (stdout/stderr are pipes) and its cgroup (``None`` without cgroups);
        the caller must :func:`supervise` it and then remove the cgroup.
    """
    factory = cgroups.detect()
    overhead = BWRAP_PIDS_OVERHEAD if via_bwrap else 0
    cg = (
        factory.create(memory_mb=limits.memory_mb, pids=limits.pids + overhead, account_cpu=True)
        if factory
        else None
    )
    try:
        preexec = make_preexec(
            cg.procs_paths() if cg else [],
            rlimits(limits, cgroup=cg is not None),
            uid,
            before_drop,
            after_drop,
        )
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env or {"PATH": "/usr/bin:/bin"}, preexec_fn=preexec, start_new_session=True,
            pass_fds=pass_fds, close_fds=True, cwd="/",
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        if cg is not None:
            cg.remove()
        raise SandboxError(f"{backend}: could not start the sandbox ({exc})") from exc
    except BaseException:
        if cg is not None:
            cg.remove()
        raise
    return proc, cg


def run_once(
    argv: list[str],
    *,
    limits: Limits,
    backend: str,
    uid: int,
    pass_fds: tuple[int, ...] = (),
    before_drop: Callable[[], None] | None = None,
    after_drop: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    via_bwrap: bool = False,
) -> ExecResult:
    """Spawn ``argv`` as ``uid`` under the run's limits and collect its result.

    Args:
        argv: The command (its last argument usually a payload fd in ``pass_fds``).
        limits: Resource limits of the run.
        backend: Backend name recorded in the result.
        uid: The run's own uid (and gid), leased by the caller for the run.
        pass_fds: Fds the child inherits; the caller still owns (and closes) them.
        before_drop: Extra root-only setup in the child, run just before dropping privileges.
        after_drop: Extra setup run as nobody just before exec (e.g. loading seccomp).
        env: Environment of the child (default: only ``PATH``).
        via_bwrap: The child is bwrap (exit status ``128 + sig`` means killed by ``sig``).
    """
    start = time.monotonic()
    proc, cg = spawn(argv, limits=limits, backend=backend, uid=uid, pass_fds=pass_fds, before_drop=before_drop,
                     after_drop=after_drop, env=env, via_bwrap=via_bwrap)  # fmt: skip
    try:
        return supervise(proc, cg, limits, backend, start, via_bwrap)
    finally:
        if cg is not None:
            cg.remove()


def supervise(
    proc: subprocess.Popen[bytes],
    cg: cgroups.RunCgroup | None,
    limits: Limits,
    backend: str,
    start: float,
    via_bwrap: bool,
) -> ExecResult:
    """Collect the output of a started run, then make sure nothing of it survives.

    Args:
        proc: The run's process (stdout and stderr are pipes).
        cg: Its cgroup, killed (not removed) at the end; ``None`` without cgroups.
        limits: The run's limits (output cap, wall deadline counted from ``start``).
        backend: Backend name recorded in the result.
        start: ``time.monotonic()`` when the run was requested.
        via_bwrap: The process is bwrap (exit status ``128 + sig`` means killed by ``sig``).
    """
    assert proc.stdout is not None and proc.stderr is not None

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if cg is not None:
            cg.kill_all(timeout_s=0.5)

    pidfd = os.pidfd_open(proc.pid)
    try:
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        cap = collect([out_fd, err_fd], pidfd, cap=limits.output_bytes, deadline=start + limits.wall_s,
                      on_deadline=kill)  # fmt: skip
        if not cap.done:
            kill()
        reaped = _reap(proc, pidfd, max(0.05, start + limits.wall_s + 0.8 - time.monotonic()))
        if reaped is None:
            kill()
            reaped = _reap(proc, pidfd, None)
        returncode, cpu_used = reaped
        # The cgroup's count, where there is one (see spawn); rusage only without it.
        cg_cpu = cg.cpu_seconds() if cg is not None else None
        cpu_used = cpu_used if cg_cpu is None else max(cpu_used, cg_cpu)
        kill()  # descendants that escaped the session (double fork + setsid) die here too
        oom = cg.oom_killed() if cg is not None else False
    finally:
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    code = exit_status(returncode, via_bwrap=via_bwrap)
    stderr = cap.text(err_fd)
    timed_out = cap.timed_out or cpu_limit_hit(code, cpu_used, limits)
    memory = oom or (cg is None and stderr.rstrip().endswith("MemoryError"))
    return ExecResult(
        ok=code == 0 and not (timed_out or memory),
        exit_code=code,
        stdout=cap.text(out_fd),
        stderr=stderr,
        timed_out=timed_out,
        memory_exceeded=memory,
        output_truncated=cap.truncated,
        duration_s=time.monotonic() - start,
        backend=backend,
    )


def _reap(proc: subprocess.Popen[bytes], pidfd: int, timeout: float | None) -> tuple[int, float] | None:
    """Wait up to ``timeout`` for ``proc``; its exit code and CPU seconds (with its reaped
    descendants'), or ``None`` if it is still running.
    """
    if not select.select([pidfd], [], [], timeout)[0]:
        return None
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def cpu_limit_hit(code: int | None, cpu_used: float, limits: Limits) -> bool:
    """Whether a run ended at its CPU limit (:func:`rlimits`: SIGXCPU at the soft limit, SIGKILL
    at the hard one a second later).

    A snippet that ignores SIGXCPU ends by the hard limit's SIGKILL, which alone looks like any
    other kill: it is the CPU limit when the run had used at least 80% of the hard limit's CPU
    time. Not 100%: the kernel checks RLIMIT_CPU against tick-sampled user + system time, which
    ran up to ~10% ahead of the measured runtime on the reference VM (a kill at 4 s read 3.6 s
    by rusage, 3.8 s by cpuacct). A snippet that SIGKILLs itself that close to its limit is
    reported as having hit it.

    Args:
        code: Exit status (negative signal number when killed).
        cpu_used: CPU seconds the run used (its processes together).
        limits: The run's limits.
    """
    hard = math.ceil(limits.cpu_s) + 1  # as in rlimits()
    return code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_used >= 0.8 * hard)
