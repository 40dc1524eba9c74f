"""The default backend: one bubblewrap sandbox per run, as uid 65534, with seccomp and cgroups.

Each call starts ``bwrap`` as user ``nobody`` (so its user namespace maps to an unprivileged
host uid) with ``--unshare-all --unshare-user --disable-userns --new-session --die-with-parent
--clearenv``, runs Debian's ``/usr/bin/python3 -I -S`` on :mod:`arborl.sandbox.launcher`, and
tears everything down before returning.

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

import os
import shutil
from typing import ClassVar

from arborl.sandbox import cgroup as cgroups
from arborl.sandbox import common, seccomp
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

    def __init__(self, limits: Limits, *, proxy_socket: str | None = None) -> None:
        """Prepare the fixed part of the bwrap command line.

        Args:
            limits: Resource limits applied to every run.
            proxy_socket: Host path of the filtering proxy's unix socket (mode 0666), or ``None``
                for no network at all.
        """
        reason = self.probe()
        if reason is not None:
            raise SandboxError(f"bwrap backend unavailable: {reason}")
        self.limits = limits
        self.proxy_socket = common.check_proxy_socket(proxy_socket)
        self._bpf = seccomp.build_bpf(allow_inet=self.proxy_socket is not None)
        self._argv_head = self._static_args()
        cgroups.detect()  # probe the cgroup layout once, outside the timed path

    def _static_args(self) -> list[str]:
        size = str(self.limits.disk_mb << 20)
        args = [
            BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--new-session",
            "--die-with-parent", "--clearenv", "--hostname", "sandbox",
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

    def run_python(self, code: str, *, stdin: str = "", files: dict[str, bytes] | None = None) -> ExecResult:
        """Run one snippet in a fresh sandbox.

        Args:
            code: Python source, run as ``__main__`` from ``/tmp/main.py``.
            stdin: Text (or bytes) served on standard input.
            files: ``{relative path: bytes}`` written into the scratch directory first.

        Returns:
            The run's result; limits hit are fields of it, never exceptions.
        """
        request = common.make_request(
            code, stdin, files, common.PROXY_SOCKET_IN_SANDBOX if self.proxy_socket else None
        )
        payload_fd = os.memfd_create("arborl-request")
        bpf_fd = seccomp.bpf_fd(self._bpf)
        try:
            os.write(payload_fd, request)
            os.lseek(payload_fd, 0, os.SEEK_SET)
            argv = [*self._argv_head, "--seccomp", str(bpf_fd), "--", common.SYSTEM_PYTHON, "-I", "-S", "-B",
                    "-c", common.launcher_source(), str(payload_fd)]  # fmt: skip
            return common.run_once(
                argv, limits=self.limits, backend=self.name, pass_fds=(payload_fd, bpf_fd), via_bwrap=True
            )
        finally:
            os.close(payload_fd)
            os.close(bpf_fd)

    def close(self) -> None:
        """Nothing is kept between runs."""
