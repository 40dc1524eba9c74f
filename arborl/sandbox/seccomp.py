"""The seccomp-bpf filter every namespaced backend installs before the snippet runs.

The filter is built once in the parent with PyPI ``pyseccomp`` (ctypes over libseccomp 2.5) and
exported as raw BPF bytes: bwrap loads them from an fd (``--seccomp FD``); the zygote's children
and the process backend load them with ``prctl(PR_SET_SECCOMP)`` (``bpf_loader`` in
:mod:`arborl.sandbox.launcher`).

What it blocks (default action: allow; blocked calls fail with ``EPERM``, ``clone3`` with
``ENOSYS`` so libc falls back to the inspectable ``clone``):

- ``socket(AF_INET6)`` always, and ``socket(AF_INET)`` unless the run uses the proxy relay (the
  relay listens on ``127.0.0.1:3128``, so the snippet needs IPv4 sockets to reach it; the network
  namespace still has nothing but loopback);
- ``ptrace``, ``process_vm_readv/writev``, ``mount``, ``umount2``, ``pivot_root``, ``move_mount``,
  ``open_tree``, ``fsopen``, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``kexec_load``,
  ``keyctl``, ``add_key``, ``request_key``, ``unshare``, ``setns``, ``open_by_handle_at``;
- ``clone`` with ``CLONE_NEWUSER`` (nested user namespaces; bwrap also sets ``--disable-userns``);
- ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)`` with a *masked 32-bit* compare, so the
  ``TIOCSTI | 1 << 32`` variant of CVE-2019-10063 is caught too.

Syscalls of a foreign architecture (i386 ``int 0x80`` on x86_64) kill the process: that is
libseccomp's default bad-arch action.

What it does not do: it is a deny list on top of namespaces, not an allow list; it does not
restrict file access (that is the mount namespace's job) or resource use (cgroups/rlimits).
"""

from __future__ import annotations

import errno
import functools
import os
import socket

# Linux UAPI constants (stable ABI); the termios module does not export TIOCLINUX.
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

BLOCKED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
    "move_mount", "open_tree", "fsopen", "bpf", "perf_event_open", "userfaultfd", "kexec_load",
    "keyctl", "add_key", "request_key", "unshare", "setns", "open_by_handle_at",
)  # fmt: skip


def probe() -> str | None:
    """``None`` if a filter can be built here, else the reason and the fix."""
    try:
        build_bpf(allow_inet=False)
    except ImportError:
        return "PyPI package pyseccomp is missing: pip install pyseccomp==0.1.2"
    except (OSError, RuntimeError) as exc:
        return f"libseccomp is not usable ({exc}): apt-get install -y libseccomp2"
    return None


@functools.cache
def build_bpf(*, allow_inet: bool) -> bytes:
    """Compile the filter to raw BPF bytes (cached per variant).

    Args:
        allow_inet: Leave ``socket(AF_INET)`` allowed (needed to reach the in-sandbox proxy relay).

    Returns:
        The BPF program as exported by ``seccomp_export_bpf``.
    """
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in BLOCKED_SYSCALLS:
        try:
            flt.add_rule(eperm, name)
        except (ValueError, RuntimeError, OSError):
            continue  # syscall unknown to this libseccomp/arch: nothing to block
    families = [socket.AF_INET6] if allow_inet else [socket.AF_INET, socket.AF_INET6]
    for family in families:
        flt.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, family))
    for request in (TIOCSTI, TIOCLINUX):
        # Masked compare on the low 32 bits: the kernel truncates the ioctl number to 32 bits.
        flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # clone3 passes its flags in a struct seccomp cannot read; ENOSYS makes glibc use clone.
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("arborl-seccomp")
    try:
        with os.fdopen(os.dup(fd), "wb", closefd=True) as fh:
            flt.export_bpf(fh)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def bpf_fd(bpf: bytes) -> int:
    """Return a fresh memfd holding ``bpf`` at offset 0 (for ``bwrap --seccomp FD``)."""
    fd = os.memfd_create("arborl-seccomp")
    os.write(fd, bpf)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
