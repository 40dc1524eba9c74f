"""A weaker backend without extra packages: namespaces via ``libc.unshare``, rlimits, nobody.

Each call spawns Debian's ``/usr/bin/python3`` whose ``preexec_fn`` (still root) joins the run's
cgroup, sets rlimits, ``unshare``\\ s new net/mount/ipc/uts namespaces through ctypes (``os.unshare``
only exists from Python 3.12), brings up loopback, mounts fresh size-capped tmpfs over ``/tmp``,
``/var/tmp`` and ``/dev/shm``, drops to a uid/gid leased for this one run
(:mod:`arborl.sandbox.uids`) and installs the seccomp filter.

What it isolates:

- **Environment:** the snippet gets only ``PATH HOME TMPDIR LANG USER``.
- **Network:** a new network namespace with only loopback (no DNS, no host services); with
  ``proxy_socket`` the socket is bind-mounted at ``/run/arborl/proxy.sock`` and the relay on
  ``127.0.0.1:3128`` forwards to it.
- **Scratch:** per-run tmpfs at ``/tmp`` (cwd), ``/var/tmp``, ``/dev/shm``, each of ``disk_mb``;
  a private ``/run`` hides the host's runtime sockets (e.g. ``/run/docker.sock``).
- **Resources:** memory + pids cgroup when the machine has one (else RLIMIT_AS / RLIMIT_NPROC),
  RLIMIT_CPU/FSIZE, the wall deadline, capped output; descendants are killed through the cgroup.
- **Privileges:** a uid of its own, no capabilities, ``no_new_privs`` and the seccomp filter (no
  nested user namespaces, ptrace, mount, bpf, keyctl, inet sockets, io_uring, TIOCSTI).
- **Other sandboxes:** no other sandbox (of any backend) runs as the run's uid meanwhile, and
  the interpreter is non-dumpable, so ``kill(-1, SIGKILL)`` reaches only the run's own
  processes and ``/proc/PID/root`` of other runs is refused: it cannot kill them, read their
  inputs or plant files in their scratch dirs.

What it does NOT isolate (use ``bwrap`` for these):

- **Host files:** the whole host tree is visible with the permissions of ``nobody``: every
  world-readable file (the project tree, ``/etc``) can be read, and world-writable places other
  than the three tmpfs (if any exist) can be written.
- **Processes:** no pid namespace. The snippet sees every host process in ``/proc`` (pids,
  command lines, owners; not their memory, environment or files). Without a cgroup a
  double-forked daemon escapes the process-group kill; it is killed by uid once the run ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
from typing import ClassVar

from arborl.sandbox import cgroup as cgroups
from arborl.sandbox import common, seccomp, uids
from arborl.sandbox.base import ExecResult, Limits, SandboxError
from arborl.sandbox.launcher import bpf_loader

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
_SCRATCH_MOUNTS = ("/tmp", "/var/tmp", "/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _isolate(tmpfs_opts: bytes, proxy: str | None) -> None:
    """Child side, as root: new namespaces, loopback up, private tmpfs scratch, private /run."""
    _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    # Mounts below must not propagate back to the host's mount namespace.
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # Hold the proxy socket by fd (opened in the new namespace, or the bind is refused): the
    # tmpfs mounted over /tmp or /run may hide its path.
    proxy_fd = os.open(proxy, os.O_PATH) if proxy else None
    for path in _SCRATCH_MOUNTS:
        if os.path.isdir(path):
            _check(
                _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts),
                f"mount {path}",
            )
    # A fresh /run hides the host's runtime sockets (docker.sock, service sockets) and holds the proxy.
    _check(_libc.mount(b"tmpfs", b"/run", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755"), "mount /run")
    if proxy_fd is not None:
        os.mkdir("/run/arborl", 0o755)
        os.close(os.open(common.PROXY_SOCKET_IN_SANDBOX, os.O_CREAT | os.O_WRONLY, 0o666))
        src = f"/proc/self/fd/{proxy_fd}".encode()
        _check(
            _libc.mount(src, common.PROXY_SOCKET_IN_SANDBOX.encode(), None, MS_BIND, None),
            "bind proxy socket",
        )
        os.close(proxy_fd)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING)
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, ifreq)


class ProcessBackend:
    """Namespaces + rlimits + nobody, no extra packages; weaker than bwrap (see module docstring)."""

    name: ClassVar[str] = "process"
    guarantees: ClassVar[frozenset[str]] = frozenset(
        {"env", "network", "pids", "memory", "disk", "cpu", "orphans", "privileges"}
    )

    @classmethod
    def probe(cls) -> str | None:
        """``None`` if this machine can run it (root, Linux namespaces, Debian's python3)."""
        if os.geteuid() != 0:
            return "the process backend must run as root (it unshares namespaces and drops to a sandbox uid)"
        if not os.path.exists(common.SYSTEM_PYTHON):
            return f"{common.SYSTEM_PYTHON} is missing: apt-get install -y python3"
        if not os.path.exists("/proc/self/ns/net"):
            return "the kernel has no network namespaces"
        return seccomp.probe()

    def __init__(self, limits: Limits, *, proxy_socket: str | None = None) -> None:
        """Prepare the per-run setup.

        Args:
            limits: Resource limits applied to every run.
            proxy_socket: Host path of the proxy's unix socket (mode 0666), or ``None``.
        """
        reason = self.probe()
        if reason is not None:
            raise SandboxError(f"process backend unavailable: {reason}")
        self.limits = limits
        self.proxy_socket = common.check_proxy_socket(proxy_socket)
        self._load_seccomp = bpf_loader(seccomp.build_bpf(allow_inet=self.proxy_socket is not None))
        self._tmpfs_opts = f"size={limits.disk_mb << 20},mode=1777".encode()
        cgroups.detect()

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run one snippet (see :meth:`arborl.sandbox.Sandbox.run_python`)."""
        request = common.make_request(code, files, common.PROXY_SOCKET_IN_SANDBOX if self.proxy_socket else None)
        payload_fd = common.new_memfd("arborl-request", request)
        stdin_fd = common.new_memfd("arborl-stdin", common.stdin_bytes(stdin))
        lease = None
        try:
            lease = uids.lease()
            opts, proxy = self._tmpfs_opts, self.proxy_socket
            argv = [common.SYSTEM_PYTHON, "-I", "-S", "-B", "-c", common.launcher_source(), str(payload_fd),
                    str(stdin_fd)]  # fmt: skip
            return common.run_once(
                argv, limits=self.limits, backend=self.name, uid=lease.uid, pass_fds=(payload_fd, stdin_fd),
                before_drop=lambda: _isolate(opts, proxy), after_drop=self._load_seccomp, env=dict(common.SANDBOX_ENV),
            )  # fmt: skip
        finally:
            os.close(payload_fd)
            os.close(stdin_fd)
            if lease is not None:
                # Without a cgroup, descendants that left the process group are found by uid.
                lease.release(kill=cgroups.detect() is None)

    def close(self) -> None:
        """Nothing is kept between runs."""
