"""Attacks on the state that warm sandboxes keep between runs: one property per test, every backend.

A run plants something (a SysV IPC object, a POSIX message queue, shared memory it never frees,
a scratch tree built to break the wipe, a TCP TIME_WAIT); then several runs follow on the same
sandbox, so the planted state meets the next run whatever order a pool hands out its workers in.
None of them may see the planted state or suffer from it. Backends whose runs share the host's
namespaces by design (``process``: no ``cross_run`` guarantee) are skipped with that reason;
``wasm`` has no IPC and no network at all, so those attacks do not apply to it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from backendkit import FakeProxy, need

from arborl.sandbox import BACKENDS, Limits, Sandbox
from arborl.sandbox.core import backend_class, probe_backend

LIMITS = Limits(wall_s=8.0, cpu_s=6.0, memory_mb=192, pids=48, disk_mb=16, output_bytes=64 << 10)
FOLLOWERS = 3  # runs after the planting one: more than any pool here holds idle sandboxes


def _open(name: str, proxy: str | None = None) -> Sandbox:
    reason = probe_backend(name)
    if reason is not None:
        need(f"sandbox backend {name!r} unavailable: {reason}")
    if "cross_run" not in getattr(backend_class(name), "guarantees", frozenset({"cross_run"})):
        pytest.skip(f"backend {name!r} documents that runs share state (no 'cross_run' guarantee)")
    return Sandbox(name, LIMITS, proxy_socket=proxy)


@pytest.fixture(scope="module", params=list(BACKENDS))
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    sb = _open(request.param)
    yield sb
    sb.close()


def _no_wasm(sb: Sandbox, what: str) -> None:
    if sb.backend_name == "wasm":
        pytest.skip(f"WASI has no {what}: nothing to leave behind")


def _ok(sb: Sandbox, code: str) -> str:
    res = sb.run_python(code)
    assert res.ok and res.error is None, res
    return res.stdout


def _followers(sb: Sandbox, code: str) -> list[str]:
    return [_ok(sb, code) for _ in range(FOLLOWERS)]


_LIBC = "import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
KEY = 0x4152424F  # a fixed SysV key, so the next run can look the objects up by it

PLANT_SYSV = _LIBC + f"""
shm = libc.shmget({KEY}, 4096, 0o1666)  # IPC_CREAT | 0666
ctypes.memmove(libc.shmat(shm, None, 0), b"secret-of-an-earlier-run", 24)
msq = libc.msgget({KEY}, 0o1666)
sem = libc.semget({KEY}, 1, 0o1666)
print(json.dumps([shm, msq, sem]))
"""
PROBE_SYSV = _LIBC + f"""
found = [libc.shmget({KEY}, 0, 0), libc.msgget({KEY}, 0), libc.semget({KEY}, 0, 0)]
listed = [len(open(f"/proc/sysvipc/{{n}}").read().splitlines()) - 1 for n in ("shm", "msg", "sem")]
print(json.dumps({{"found": found, "listed": listed}}))
"""


def test_sysv_ipc_objects_do_not_reach_the_next_run(sandbox: Sandbox) -> None:
    _no_wasm(sandbox, "IPC")
    assert -1 not in json.loads(_ok(sandbox, PLANT_SYSV))  # the objects did exist
    for out in _followers(sandbox, PROBE_SYSV):
        assert json.loads(out) == {"found": [-1, -1, -1], "listed": [0, 0, 0]}


PLANT_MQUEUE = _LIBC + """
fd = libc.mq_open(b"/arborl-left", os.O_CREAT | os.O_RDWR, 0o666, None)
print(fd, libc.mq_send(fd, b"secret", 6, 0))
"""
PROBE_MQUEUE = _LIBC + """
fd = libc.mq_open(b"/arborl-left", os.O_RDONLY)
listed = os.listdir("/dev/mqueue") if os.path.isdir("/dev/mqueue") else []
print(json.dumps([fd, ctypes.get_errno(), listed]))
"""


def test_posix_message_queues_do_not_reach_the_next_run(sandbox: Sandbox) -> None:
    _no_wasm(sandbox, "IPC")
    fd, sent = _ok(sandbox, PLANT_MQUEUE).split()
    assert int(fd) >= 0 and sent == "0"
    for out in _followers(sandbox, PROBE_MQUEUE):
        assert json.loads(out) == [-1, 2, []]  # ENOENT


SHM_MB = int(LIMITS.memory_mb * 0.6)
PLANT_SHM_HOG = _LIBC + f"""
size = {SHM_MB} << 20
addr = libc.shmat(libc.shmget(0, size, 0o1600), None, 0)  # IPC_PRIVATE, never IPC_RMID
ctypes.memset(addr, 1, size)  # touch every page: charged to this sandbox's memory
print("planted")
"""
USE_MEMORY = f"x = bytearray({SHM_MB} << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint('fits')"


def test_shared_memory_left_behind_does_not_starve_later_runs(sandbox: Sandbox) -> None:
    _no_wasm(sandbox, "IPC")
    assert _ok(sandbox, PLANT_SHM_HOG) == "planted\n"
    assert _followers(sandbox, USE_MEMORY) == ["fits\n"] * FOLLOWERS


PLANT_TREE = """
import os
top = os.open(".", os.O_RDONLY)
os.mkdir("deep")
os.chdir("deep")
depth = 0
for depth in range(1, 3001):
    try:
        os.mkdir("d")
        os.chdir("d")
    except OSError:
        break
try:
    open("leaf", "w").write("x")
    os.chmod(".", 0o300)  # the deepest level cannot be listed...
    os.fchdir(top)
    os.chmod("deep", 0)  # ... and the top cannot even be entered
except (OSError, AttributeError):
    pass
print(depth)
"""


def test_a_scratch_tree_built_to_break_the_wipe_leaves_the_next_run_clean(sandbox: Sandbox) -> None:
    listing = "import os\nprint(sorted(os.listdir('.')))"
    fresh = _ok(sandbox, listing)  # what a clean scratch holds here ([], or the launcher's main.py)
    depth = int(_ok(sandbox, PLANT_TREE))
    assert depth > 100  # deep enough to matter (3000 where paths may exceed PATH_MAX)
    assert _followers(sandbox, listing) == [fresh] * FOLLOWERS


@pytest.fixture(scope="module", params=list(BACKENDS))
def networked(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox with a proxy socket: AF_INET sockets are allowed there (to reach the relay)."""
    if request.param == "wasm":
        pytest.skip("WASI has no network: nothing to leave behind")
    folder = tempfile.mkdtemp(prefix="arborl-proxy-")
    os.chmod(folder, 0o711)  # the sandbox user must reach the socket inside
    proxy = FakeProxy(os.path.join(folder, "proxy.sock"))
    try:
        sb = _open(request.param, proxy.path)
        yield sb
        sb.close()
    finally:
        proxy.close()
        shutil.rmtree(folder, ignore_errors=True)


PLANT_TIME_WAIT = """
import socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]
client = socket.create_connection(("127.0.0.1", port))
conn, _ = srv.accept()
client.close()  # the side that closes first keeps the connection in TIME_WAIT
conn.close()
time.sleep(0.2)
print(port)
"""
PROBE_TCP = """
import json
rows = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except OSError:
        continue
    rows += [(int(line.split()[1].rsplit(":", 1)[1], 16), line.split()[3]) for line in lines]
print(json.dumps(rows))
"""


def test_tcp_time_wait_is_not_visible_to_the_next_run(networked: Sandbox) -> None:
    port = int(_ok(networked, PLANT_TIME_WAIT))
    for out in _followers(networked, PROBE_TCP):
        rows = json.loads(out)
        # The run's own relay listens on 3128 (state 0A); nothing of the earlier run may show.
        assert all(p != port and state != "06" for p, state in rows), rows
