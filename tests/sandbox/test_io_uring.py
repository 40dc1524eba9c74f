"""Probes: io_uring is refused, so its ``IORING_OP_SOCKET`` cannot sidestep the socket rule.

An io_uring submission runs in the kernel without a syscall of its own that seccomp could
inspect: ``IORING_OP_SOCKET`` returned AF_INET sockets while ``socket(AF_INET)`` got EPERM. The
filter refuses the three io_uring syscalls instead.
"""

from __future__ import annotations

import json

import pytest
from sbutil import run_ok

from arborl.sandbox import Sandbox

# x86_64 syscall numbers (the same on every architecture that has them: the new syscall table).
IO_URING = """
import errno, json
try:
    import ctypes
except ImportError:
    print(json.dumps({"ctypes": False}))
    raise SystemExit
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def err(r):
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)  # io_uring_setup(4 entries, params)
res = {"ctypes": True, "setup": err(fd)}
res["enter"] = err(libc.syscall(426, ctypes.c_long(-1), 0, 0, 0, 0, 0))  # io_uring_enter(-1): EBADF unfiltered
res["register"] = err(libc.syscall(427, ctypes.c_long(-1), 0, 0, 0))  # io_uring_register(-1): EBADF unfiltered
print(json.dumps(res))
"""

# The attack itself: map the rings, submit IORING_OP_SOCKET(AF_INET, SOCK_STREAM), read the CQE.
SOCKET_OP = """
import ctypes, errno, json, mmap, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)
if fd < 0:
    print(json.dumps({"setup": errno.errorcode.get(ctypes.get_errno(), "?")}))
    raise SystemExit
sq_entries, cq_entries = struct.unpack_from("II", params, 0)
sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("7I", params, 40)
cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("6I", params, 80)
size = max(sq_array + 4 * sq_entries, cqes + 16 * cq_entries)
ring = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
sqes = mmap.mmap(fd, 64 * sq_entries, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0x10000000)
sqe = bytearray(64)
struct.pack_into("BBHiQ", sqe, 0, 45, 0, 0, socket.AF_INET, socket.SOCK_STREAM)  # IORING_OP_SOCKET
struct.pack_into("Q", sqe, 32, 7)  # user_data
sqes[0:64] = bytes(sqe)
tail = struct.unpack_from("I", ring, sq_tail)[0]
struct.pack_into("I", ring, sq_array + 4 * (tail & struct.unpack_from("I", ring, sq_mask)[0]), 0)
struct.pack_into("I", ring, sq_tail, tail + 1)
n = libc.syscall(426, fd, 1, 1, 1, 0, 0)  # io_uring_enter(fd, 1, min_complete=1, GETEVENTS)
head = struct.unpack_from("I", ring, cq_head)[0]
_, result, _ = struct.unpack_from("QiI", ring, cqes + 16 * (head & struct.unpack_from("I", ring, cq_mask)[0]))
out = {"setup": "ok", "enter": n, "result": result}
if result >= 0:
    out["family"] = int(socket.socket(fileno=result).family)
print(json.dumps(out))
"""


def _io_uring(sandbox: Sandbox) -> dict:
    res = json.loads(run_ok(sandbox, IO_URING))
    if not res["ctypes"]:
        pytest.skip(f"{sandbox.backend_name}: no ctypes, so no raw syscalls at all")
    return res


def test_io_uring_syscalls_are_refused(sandbox: Sandbox) -> None:
    res = _io_uring(sandbox)
    for call in ("setup", "enter", "register"):
        assert res[call] in ("EPERM", "ENOSYS"), (call, res)


def test_io_uring_socket_op_opens_no_inet_socket(sandbox: Sandbox) -> None:
    _io_uring(sandbox)  # skips where raw syscalls cannot be made
    res = json.loads(run_ok(sandbox, SOCKET_OP))
    assert res["setup"] in ("EPERM", "ENOSYS"), res
    assert "family" not in res, res
