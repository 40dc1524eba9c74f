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
  ``keyctl``, ``add_key``, ``request_key``, ``unshare``, ``setns``, ``open_by_handle_at``,
  ``syslog`` (the host's kernel log, readable without privileges where ``dmesg_restrict=0``);
- ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: an io_uring submission runs in
  the kernel without a syscall seccomp could inspect, so ``IORING_OP_SOCKET`` would hand out the
  AF_INET/AF_INET6 sockets that the ``socket`` rule refuses (Docker's default profile refuses
  io_uring too);
- ``clone`` with ``CLONE_NEWUSER`` (nested user namespaces; bwrap also sets ``--disable-userns``);
- ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)`` with a *masked 32-bit* compare, so the
  ``TIOCSTI | 1 << 32`` variant of CVE-2019-10063 is caught too.

Syscalls of a foreign architecture (i386 ``int 0x80`` on x86_64) kill the process: that is
libseccomp's default bad-arch action.

The rule list (:func:`rules`) is the one definition of the policy: :func:`build_bpf` compiles it
for bwrap, the zygote and the process backend, and :func:`docker_profile` writes the same rules
as a Docker seccomp profile (JSON) for the docker backend.

What it does not do: it is a deny list on top of namespaces, not an allow list; it does not
restrict file access (that is the mount namespace's job) or resource use (cgroups/rlimits).
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from typing import Any, NamedTuple

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
    "keyctl", "add_key", "request_key", "unshare", "setns", "open_by_handle_at", "syslog",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip


_U32 = 0xFFFFFFFF


class ArgCheck(NamedTuple):
    """A condition on one syscall argument: ``arg[index] & mask == value`` (``mask=None``: ``==``)."""

    index: int
    value: int
    mask: int | None = None


class Rule(NamedTuple):
    """Fail syscall ``name`` with ``errno`` (when ``arg`` is given: only if the argument matches)."""

    name: str
    errno: int
    arg: ArgCheck | None = None


def rules(*, allow_inet: bool) -> list[Rule]:
    """The whole deny list, in the order it is installed (see the module docstring).

    Args:
        allow_inet: Leave ``socket(AF_INET)`` allowed (needed to reach the in-sandbox proxy relay).

    Returns:
        One :class:`Rule` per syscall (and argument condition) to refuse.
    """
    out = [Rule(name, errno.EPERM) for name in BLOCKED_SYSCALLS]
    families = [socket.AF_INET6] if allow_inet else [socket.AF_INET, socket.AF_INET6]
    out += [Rule("socket", errno.EPERM, ArgCheck(0, int(family))) for family in families]
    # Masked compare on the low 32 bits: the kernel truncates the ioctl number to 32 bits.
    out += [Rule("ioctl", errno.EPERM, ArgCheck(1, request, _U32)) for request in (TIOCSTI, TIOCLINUX)]
    out.append(Rule("clone", errno.EPERM, ArgCheck(0, CLONE_NEWUSER, CLONE_NEWUSER)))
    # clone3 passes its flags in a struct seccomp cannot read; ENOSYS makes glibc use clone.
    out.append(Rule("clone3", errno.ENOSYS))
    return out


def docker_profile(*, allow_inet: bool) -> dict[str, Any]:
    """The :func:`rules` as a Docker seccomp profile (``docker run --security-opt seccomp=FILE``).

    No ``architectures`` list: runc then builds the filter for the native architecture only, and
    libseccomp's default bad-arch action kills a process that makes a foreign-architecture
    syscall (i386 ``int 0x80`` on x86_64), exactly as :func:`build_bpf` does. Listing
    ``SCMP_ARCH_X86`` as Docker's own profile does would instead let those syscalls through
    whenever no rule names them. Syscall names runc does not know on this architecture are
    skipped by runc, as :func:`build_bpf` skips them.

    Args:
        allow_inet: Leave ``socket(AF_INET)`` allowed (the container reaches the proxy relay over
            ``127.0.0.1``).

    Returns:
        The profile as a JSON-ready dict.
    """
    entries: list[dict[str, Any]] = []
    for rule in rules(allow_inet=allow_inet):
        entry: dict[str, Any] = {"names": [rule.name], "action": "SCMP_ACT_ERRNO", "errnoRet": rule.errno}
        if rule.arg is not None:
            # Docker's field order follows libseccomp: for MASKED_EQ "value" is the mask and
            # "valueTwo" the datum compared with ``arg & mask``.
            arg = rule.arg
            entry["args"] = [
                {"index": arg.index, "value": arg.value, "valueTwo": 0, "op": "SCMP_CMP_EQ"}
                if arg.mask is None
                else {
                    "index": arg.index,
                    "value": arg.mask,
                    "valueTwo": arg.value,
                    "op": "SCMP_CMP_MASKED_EQ",
                }
            ]
        entries.append(entry)
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": entries}


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
    for rule in rules(allow_inet=allow_inet):
        args = []
        if rule.arg is not None:
            a = rule.arg
            args = [
                sc.Arg(a.index, sc.EQ, a.value)
                if a.mask is None
                else sc.Arg(a.index, sc.MASKED_EQ, a.mask, a.value)
            ]
        try:
            flt.add_rule(sc.ERRNO(rule.errno), rule.name, *args)
        except (ValueError, RuntimeError, OSError):
            if rule.arg is not None:
                raise  # the argument rules name syscalls every architecture has
            continue  # syscall unknown to this libseccomp/arch: nothing to block
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
