"""Shared types of the sandbox: resource limits, the result of a run, the backend contract.

Every backend runs one Python snippet per call, from a clean scratch directory, under
:class:`Limits`, and returns an :class:`ExecResult`. A backend never raises for anything the
snippet does (crash, timeout, memory bomb, output flood): those are fields of the result.
It raises :class:`SandboxError` only when the sandbox itself cannot work (backend missing,
misconfigured), with a message that names the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code inside it); the message names the fix."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.

    Attributes:
        wall_s: Wall-clock deadline; the run is killed at it and the call returns within ~1 s.
        cpu_s: CPU-time limit (RLIMIT_CPU or equivalent).
        memory_mb: Memory limit (cgroup where available, else RLIMIT_AS / store limits). Files
            written to a tmpfs scratch count against it too.
        pids: Maximum number of processes/threads of the snippet (its main process included).
        disk_mb: Total bytes the snippet may write to its scratch space.
        output_bytes: Cap on each of stdout and stderr kept by the caller; the rest is dropped.
    """

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 256
    pids: int = 64
    disk_mb: int = 64
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "pids", "disk_mb", "output_bytes"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {v!r}")


@dataclass
class ExecResult:
    """Outcome of one snippet run.

    Attributes:
        ok: Exit code 0, not killed at a limit and no sandbox error. Truncated output alone does
            not clear it; check ``output_truncated`` when the full output matters.
        exit_code: Process exit code (negative signal number if killed by a signal).
        stdout: Captured standard output (decoded UTF-8, errors replaced), capped.
        stderr: Captured standard error, capped.
        timed_out: Killed at the wall or CPU deadline. The CPU limit counts whichever way it
            ended the run: SIGXCPU at the soft limit, or SIGKILL at the hard limit when the
            snippet ignored or blocked SIGXCPU (``exit_code`` is then ``-9``).
        memory_exceeded: Killed or failed at the memory limit.
        output_truncated: stdout or stderr exceeded ``Limits.output_bytes``.
        duration_s: Wall time of the call as seen by the caller.
        backend: Name of the backend that ran it.
        error: Sandbox-side error text (not the snippet's), if any.
    """

    ok: bool
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    memory_exceeded: bool = False
    output_truncated: bool = False
    duration_s: float = 0.0
    backend: str = ""
    error: str | None = None


class Backend(Protocol):
    """What a backend module provides (one class per module).

    Besides these members a backend class has the constructor
    ``Cls(limits: Limits, *, proxy_socket: str | None = None)`` (``proxy_socket``: host path of the
    filtering proxy's unix socket, the only network path out; ``None`` = no network) and may
    declare ``guarantees: ClassVar[frozenset[str]]``, the properties the threat suite
    (``tests/sandbox``) holds it to: ``env``, ``host_files``, ``network``, ``pids``, ``memory``,
    ``disk``, ``cpu``, ``orphans``, ``privileges``, ``cross_run``. Without the attribute it is
    held to all of them. Every backend is held, whatever it declares, to the probes of
    ``tests/sandbox/test_other_runs.py``: no other run can signal its processes, open its
    ``/proc/PID/root`` or plant files in its scratch (a uid of its own per sandbox,
    :mod:`arborl.sandbox.uids`).
    """

    name: ClassVar[str]

    @classmethod
    def probe(cls) -> str | None:
        """``None`` if the backend works on this machine, else the reason it does not."""
        ...

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run ``code`` from a clean scratch dir holding ``files``, with ``stdin``; never raise for
        what the snippet does.
        """
        ...

    def close(self) -> None:
        """Release warm processes/containers; idempotent."""
        ...
