"""Host uids for sandboxed code: one of a reserved range per sandbox, never shared while in use.

Every backend used to run snippets as uid 65534 (``nobody``). The kernel lets processes of one
uid signal each other (``kill(-1, SIGKILL)`` reaches them all) and open each other's
``/proc/PID/root`` when the target is dumpable, so one run could kill or tamper with any other
run of any backend, and with every host daemon that runs as ``nobody``. Now each sandbox (a
bwrap spare, a zygote runner, a process-backend run, a docker container, a wasm worker) runs as
a uid leased from :data:`UID_RANGE`, which no other sandbox holds at the same time; gid = uid.

A lease is a lock file ``<LEASE_DIR>/<uid>`` held with ``flock`` for as long as the sandbox
lives (a caller that is not root, e.g. a docker-group user of the docker backend, keeps its
leases in a private directory of its own, ``<tmp>/arborl-sandbox-uids-<euid>``: exclusive among
its own sandboxes only), so leases are exclusive across threads and across processes, and a lease whose owner dies
is released by the kernel. A clean :meth:`UidLease.release` (after every process of the
sandbox is gone) deletes the file; a file left behind without a lock therefore marks a uid whose
owner died mid-run, and :func:`lease` first kills whatever still runs as that uid before handing
it out again (:func:`kill_uid`).

The range defaults to 65,536 uids from 1,900,000,000 (inside 0x70000000-0x7FFDFFFF, which
systemd's uid ranges leave unused and which ``/etc/subuid`` allocations do not reach on common
hosts). ``ARBORL_SANDBOX_UIDS=FIRST:COUNT`` moves it, e.g. where that range maps containers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field

from arborl.sandbox.base import SandboxError

LEASE_DIR = "/run/arborl-sandbox-uids"
DEFAULT_FIRST_UID = 1_900_000_000
DEFAULT_UID_COUNT = 1 << 16
_MAX_UID = 0xFFFFFFFE  # (uid_t)-1 means "no change" to setresuid


def _uid_range() -> range:
    spec = os.environ.get("ARBORL_SANDBOX_UIDS", "")
    if not spec:
        return range(DEFAULT_FIRST_UID, DEFAULT_FIRST_UID + DEFAULT_UID_COUNT)
    first, sep, count = spec.partition(":")
    try:
        lo, n = int(first), int(count)
    except ValueError:
        lo, n = -1, 0
    if not sep or lo < 1000 or n < 64 or lo + n > _MAX_UID:
        raise SandboxError(
            f"ARBORL_SANDBOX_UIDS={spec!r} must be FIRST:COUNT with FIRST >= 1000, COUNT >= 64 and "
            f"FIRST + COUNT <= {_MAX_UID} (uids no user, daemon or container mapping on this host uses)"
        )
    return range(lo, lo + n)


UID_RANGE = _uid_range()
"""The reserved uids (gid = uid); ``ARBORL_SANDBOX_UIDS=FIRST:COUNT`` overrides the default."""

_cursor_lock = threading.Lock()
_cursor = [random.randrange(len(UID_RANGE))]  # a random start: processes rarely probe the same uids


@dataclass
class UidLease:
    """One uid held for one sandbox; :meth:`release` it once nothing of the sandbox runs."""

    uid: int
    _fd: int = field(repr=False)

    def release(self, *, kill: bool = False) -> None:
        """Give the uid back (idempotent).

        Args:
            kill: First kill every process still running as the uid (for backends that cannot
                otherwise be sure that nothing of the sandbox survived, e.g. without cgroups).
        """
        if self._fd < 0:
            return
        if kill:
            kill_uid(self.uid)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_path(self.uid))  # before the unlock: see the module docstring
        fd, self._fd = self._fd, -1
        os.close(fd)


def _lease_root() -> str:
    euid = os.geteuid()
    return LEASE_DIR if euid == 0 else os.path.join(tempfile.gettempdir(), f"arborl-sandbox-uids-{euid}")


def _path(uid: int) -> str:
    return os.path.join(_lease_root(), str(uid))


def _lease_dir() -> None:
    root = _lease_root()
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SandboxError(f"cannot create the uid lease directory {root} ({exc}); check its parent") from exc
    st = os.lstat(root)
    if not os.path.isdir(root) or os.path.islink(root) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"{root} must be a directory of this user with mode 0700; remove it and retry")


def _try(uid: int) -> UidLease | None:
    """Lock ``uid``'s file; ``None`` if another sandbox holds it."""
    path = _path(uid)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fresh = True
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None  # released meanwhile: the next candidate will do
        fresh = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # A releaser unlinks the file before it unlocks: a lock on an unlinked inode is no lease.
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if not fresh:
        kill_uid(uid)  # the previous holder died without releasing it: end what it left running
    return UidLease(uid, fd)


def lease() -> UidLease:
    """Lease a uid of :data:`UID_RANGE` that no other sandbox on this host holds.

    Raises:
        SandboxError: The lease directory is unusable, or every uid is leased.
    """
    _lease_dir()
    n = len(UID_RANGE)
    with _cursor_lock:
        start = _cursor[0]
        _cursor[0] = (start + 1) % n
    for i in range(n):
        got = _try(UID_RANGE[(start + i) % n])
        if got is not None:
            with _cursor_lock:
                _cursor[0] = (start + i + 1) % n
            return got
    raise SandboxError(
        f"all {n} sandbox uids of {UID_RANGE.start}-{UID_RANGE.stop - 1} are in use; close idle sandboxes "
        "or widen the range with ARBORL_SANDBOX_UIDS=FIRST:COUNT"
    )


def conflicts(
    uid_range: range | None = None,
    *,
    passwd: str = "/etc/passwd",
    subid_files: tuple[str, ...] = ("/etc/subuid", "/etc/subgid"),
) -> list[str]:
    """Host uses of the reserved range: passwd users and subuid/subgid ranges that fall in it.

    ``scripts/setup/sandbox.sh`` refuses to finish while this is not empty.

    Args:
        uid_range: The range to check (default :data:`UID_RANGE`).
        passwd: A passwd-format file (``name:x:uid:...``).
        subid_files: subuid/subgid-format files (``name:first:count``).

    Returns:
        One line per conflict, naming the file, the entry and the overlap.
    """
    r = uid_range or UID_RANGE
    out: list[str] = []
    with contextlib.suppress(OSError), open(passwd) as fh:
        for line in fh:
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit() and int(fields[2]) in r:
                out.append(f"{passwd}: user {fields[0]} has uid {fields[2]}")
    for path in subid_files:
        with contextlib.suppress(OSError), open(path) as fh:
            for line in fh:
                fields = line.strip().split(":")
                if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                    lo, n = int(fields[1]), int(fields[2])
                    if lo < r.stop and r.start < lo + n:
                        out.append(f"{path}: {fields[0]} maps {lo}-{lo + n - 1}")
    return out


def _uids_of(pid: int | str) -> list[bytes]:
    """Real, effective, saved and fs uid of ``pid`` (empty once it has exited)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return line.split()[1:]
    except OSError:
        pass
    return []


def _running_as(uid: int) -> list[int]:
    """Pids of host processes whose real, effective, saved or fs uid is ``uid``."""
    key = str(uid).encode()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and key in _uids_of(name)]


def kill_uid(uid: int, *, timeout_s: float = 2.0) -> None:
    """SIGKILL every host process running as ``uid`` until none is left (bounded by ``timeout_s``).

    Each process is signalled through a pidfd after its uid was read again, so a recycled pid is
    never hit. ``/proc/PID`` owners cannot be trusted (a non-dumpable process shows root), so the
    uid comes from ``/proc/PID/status``.
    """
    key = str(uid).encode()
    end = time.monotonic() + timeout_s
    while pids := _running_as(uid):
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # exited meanwhile
            try:
                if key in _uids_of(pid):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # gone, or not ours to kill (a caller that is not root)
            finally:
                os.close(pidfd)
        if time.monotonic() > end:
            return
        time.sleep(0.002)
