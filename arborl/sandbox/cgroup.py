"""Per-run memory and pids cgroups (v1 or v2, detected at runtime), with a kill-all.

Each run gets its own group below the caller's own cgroup (``<own>/arborl/<run>``) with
``memory`` and ``pids`` limits. The child joins it *before* it execs anything (the backend writes
``0`` -- "the writing process" -- to ``cgroup.procs`` from ``preexec_fn`` while still root), so
every descendant is accounted and can be found again by :meth:`RunCgroup.kill_all`.

Layouts handled:

- cgroup v1 (the hybrid layout of the reference VMs): ``/sys/fs/cgroup/memory`` and
  ``/sys/fs/cgroup/pids`` hierarchies; limits ``memory.limit_in_bytes`` (+ ``memsw`` when swap
  accounting exists) and ``pids.max``; OOM kills read from ``memory.oom_control``.
- cgroup v2 when the unified hierarchy has the ``memory`` and ``pids`` controllers delegated to
  the caller's group: ``memory.max``, ``memory.swap.max``, ``pids.max``, ``memory.events``,
  ``cgroup.kill``.

When neither works (not root, no controllers), :func:`detect` returns ``None`` and backends fall
back to rlimits. What it does not limit: CPU time (rlimits do that) and disk (tmpfs size does).

CPU time is *accounted* on request (``create(account_cpu=True)``): v2 has ``cpu.stat`` in every
group; on v1 the run also joins a group of the ``cpuacct`` hierarchy when there is one. It tells
a run killed by its hard RLIMIT_CPU (a plain SIGKILL) from other kills where the backend cannot
wait for the snippet's process itself (bwrap's monitor exits without reaping its pid 1).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass

_ROOT = "/sys/fs/cgroup"
_counter = itertools.count()
_lock = threading.Lock()


def _own_paths() -> dict[str, str]:
    """Map controller name ('' for v2) to this process's cgroup path."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


@dataclass
class RunCgroup:
    """The cgroup directories of one run (one per v1 controller, or one v2 directory).

    ``cpu_dir`` is the run's v1 ``cpuacct`` group, when CPU time is accounted there.
    """

    dirs: list[str]
    version: int
    cpu_dir: str | None = None

    def _all_dirs(self) -> list[str]:
        return [*self.dirs, self.cpu_dir] if self.cpu_dir else list(self.dirs)

    def procs_paths(self) -> list[str]:
        """The ``cgroup.procs`` files the child must join."""
        return [os.path.join(d, "cgroup.procs") for d in self._all_dirs()]

    def cpu_seconds(self) -> float | None:
        """CPU time used by the group's processes so far; ``None`` where it is not accounted."""
        try:
            if self.version == 2:
                for line in _read(os.path.join(self.dirs[0], "cpu.stat")).splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
            elif self.cpu_dir is not None:
                return int(_read(os.path.join(self.cpu_dir, "cpuacct.usage"))) / 1e9
        except (OSError, ValueError):
            pass
        return None

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of this run."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for d in self.dirs:
            path = os.path.join(d, name)
            if not os.path.exists(path):
                continue
            for line in _read(path).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def pids(self) -> list[int]:
        """Host pids still in the group."""
        found: set[int] = set()
        for path in self.procs_paths():
            with contextlib.suppress(OSError):
                found.update(int(p) for p in _read(path).split())
        return sorted(found)

    def kill_all(self, timeout_s: float = 1.0) -> bool:
        """SIGKILL every process in the group until it is empty; ``True`` if it emptied in time."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.dirs[0], "cgroup.kill"), "1")
        end = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > end:
                return False
            time.sleep(0.002)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left and delete the directories (best effort, at most ``timeout_s``).

        A killed task leaves the group only once the kernel has reaped it, which on a loaded
        machine can take far longer than the kill itself, so the removal retries until the
        deadline instead of a fixed number of times (it returns at once when the group is empty).
        """
        end = time.monotonic() + timeout_s
        self.kill_all(timeout_s=timeout_s)
        for d in self._all_dirs():
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > end:
                        break
                    self.kill_all(timeout_s=0.0)  # a task forked during the kill
                    time.sleep(0.005)


@dataclass(frozen=True)
class CgroupFactory:
    """Creates :class:`RunCgroup` directories below a writable base."""

    bases: tuple[str, ...]
    version: int
    cpu_base: str | None = None  # v1: the cpuacct hierarchy's base, when there is one

    def create(self, *, memory_mb: int, pids: int, account_cpu: bool = False) -> RunCgroup:
        """Make a fresh group with the given limits.

        Args:
            memory_mb: Memory limit (RAM; swap is limited to the same total where configurable).
            pids: Maximum number of tasks (processes and threads).
            account_cpu: Also account the group's CPU time (:meth:`RunCgroup.cpu_seconds`); on
                v1 that is one more group (and one more ``cgroup.procs`` write) per run.
        """
        with _lock:
            name = f"run-{os.getpid()}-{next(_counter)}"
        dirs = [os.path.join(base, name) for base in self.bases]
        cpu_dir = os.path.join(self.cpu_base, name) if account_cpu and self.cpu_base else None
        cg = RunCgroup(dirs=[], version=self.version)
        try:
            for d in dirs:
                os.mkdir(d)
                cg.dirs.append(d)
            if cpu_dir is not None:
                os.mkdir(cpu_dir)
                cg.cpu_dir = cpu_dir
            self._limit(cg, memory_mb << 20, pids)
        except OSError:
            cg.remove()
            raise
        return cg

    def _limit(self, cg: RunCgroup, mem: int, pids: int) -> None:
        for d in cg.dirs:
            if self.version == 2:
                _write(os.path.join(d, "memory.max"), str(mem))
                with contextlib.suppress(OSError):
                    _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "pids.max"), str(pids))
            elif os.path.exists(os.path.join(d, "memory.limit_in_bytes")):
                _write(os.path.join(d, "memory.limit_in_bytes"), str(mem))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(mem))
            else:
                _write(os.path.join(d, "pids.max"), str(pids))


def _try_base(base: str) -> bool:
    try:
        os.makedirs(base, exist_ok=True)
        probe = os.path.join(base, f"probe-{os.getpid()}")
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError:
        return False
    return True


_detected: list[CgroupFactory | None] = []


def detect() -> CgroupFactory | None:
    """Find a usable memory+pids cgroup layout (cached); ``None`` if there is none."""
    if not _detected:
        _detected.append(_detect())
    return _detected[0]


def _detect() -> CgroupFactory | None:
    try:
        own = _own_paths()
    except OSError:
        return None
    if "memory" in own and "pids" in own:
        bases = tuple(os.path.join(_ROOT, c, own[c].lstrip("/"), "arborl") for c in ("memory", "pids"))
        if all(os.path.isdir(os.path.dirname(b)) for b in bases) and all(_try_base(b) for b in bases):
            cpu = os.path.join(_ROOT, "cpuacct", own.get("cpuacct", "/").lstrip("/"), "arborl")
            usable = "cpuacct" in own and os.path.isdir(os.path.dirname(cpu)) and _try_base(cpu)
            return CgroupFactory(bases=bases, version=1, cpu_base=cpu if usable else None)
    if "" in own:
        unified = os.path.join(_ROOT, own[""].lstrip("/"))
        try:
            enabled = _read(os.path.join(unified, "cgroup.subtree_control")).split()
        except OSError:
            return None
        base = os.path.join(unified, "arborl")
        if {"memory", "pids"} <= set(enabled) and _try_base(base):
            with contextlib.suppress(OSError):
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
            return CgroupFactory(bases=(base,), version=2)
    return None
