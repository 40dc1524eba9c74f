"""Probes: processes, memory, disk, CPU, wall time, orphans and output stay within the limits."""

from __future__ import annotations

import json
import os
import resource
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sbutil import LIMITS, require

from arborl.sandbox import Limits, Sandbox

MB = 1 << 20
# Argument of the `sleep` every fork-bomb child execs: findable on the host afterwards.
BOMB_MARK = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_fork_bomb_stops_at_pid_limit_and_host_stays_responsive(sandbox: Sandbox) -> None:
    require(sandbox, "pids")
    code = f"""
import os, time
n = 0
for _ in range(3000):
    try:
        pid = os.fork()
    except (OSError, AttributeError):
        break
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "{BOMB_MARK}"])
        finally:
            time.sleep(30)
            os._exit(0)
    n += 1
print(n)
"""
    host_times: list[float] = []
    stop = threading.Event()

    def poke_host() -> None:
        while not stop.is_set():
            t = time.monotonic()
            subprocess.run(["/bin/true"], check=True)
            host_times.append(time.monotonic() - t)
            time.sleep(0.05)

    poker = threading.Thread(target=poke_host)
    poker.start()
    try:
        res = sandbox.run_python(code)
    finally:
        stop.set()
        poker.join()
    forks = int(res.stdout.strip() or 0)
    assert forks < LIMITS.pids, (forks, res.stderr[-500:])  # the snippet itself is one of the pids
    assert host_times and max(host_times) < 2.0, host_times
    assert res.duration_s < LIMITS.wall_s + 1.0


def test_memory_bomb_is_stopped_at_the_limit(sandbox: Sandbox) -> None:
    require(sandbox, "memory")
    res = sandbox.run_python(
        f"""
chunks = []
for i in range({4 * LIMITS.memory_mb // 16}):
    chunks.append(bytearray({16 * MB}))
print("survived", len(chunks) * 16, "MiB")
"""
    )
    assert "survived" not in res.stdout
    assert not res.ok and (res.memory_exceeded or "MemoryError" in res.stderr), res


DISK_PROBE = """
import json, os
def fill(path, size, count):
    written = 0
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for i in range(count):
            with open(path % i if "%" in path else path, "ab") as f:
                f.write(b"x" * size)
                f.flush()
            written += size
    except Exception as e:
        return written, type(e).__name__
    return written, None
"""


@pytest.mark.parametrize(
    "target",
    [
        pytest.param('fill("big.bin", 1 << 20, {n})', id="one_big_file"),
        pytest.param('fill("many/f%d", 16 << 10, {n} * 64)', id="many_small_files"),
        pytest.param('fill("/dev/shm/big.bin", 1 << 20, {n})', id="dev_shm"),
    ],
)
def test_disk_fill_hits_the_cap(sandbox: Sandbox, target: str) -> None:
    require(sandbox, "disk")
    n = 4 * LIMITS.disk_mb
    res = sandbox.run_python(DISK_PROBE + f"print(json.dumps({target.format(n=n)}))")
    written, error = json.loads(res.stdout) if res.stdout else (0, res.stderr[-200:])
    assert written <= LIMITS.disk_mb * MB, (written, error)
    assert error is not None


def test_cpu_loop_is_killed_at_the_cpu_limit(backend_name: str) -> None:
    limits = Limits(wall_s=4.0, cpu_s=1.0, memory_mb=128, pids=16, disk_mb=8)
    with Sandbox(backend_name, limits) as sb:
        require(sb, "cpu")
        res = sb.run_python("while True:\n    pass")
    assert res.timed_out and not res.ok
    assert res.duration_s < limits.wall_s + 1.0


def test_sleep_is_killed_at_the_wall_deadline(sandbox: Sandbox) -> None:
    require(sandbox, "cpu")
    res = sandbox.run_python("import time\ntime.sleep(60)\nprint('woke')")
    assert res.timed_out and "woke" not in res.stdout
    assert LIMITS.wall_s - 0.1 <= res.duration_s < LIMITS.wall_s + 1.0


def test_double_forked_daemon_leaves_no_descendant(sandbox: Sandbox) -> None:
    require(sandbox, "orphans")
    for _ in range(2):  # twice: a warm backend (zygote, docker) must also reap across requests
        marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
        code = f"""
import os
try:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv("/bin/sleep", ["sleep", "{marker}"])
        os._exit(0)
    os.wait()
except (AttributeError, OSError) as e:  # no fork at all (wasm) is also fine
    print("no fork:", type(e).__name__)
print("parent done")
"""
        res = sandbox.run_python(code)
        assert "parent done" in res.stdout, res
        assert res.duration_s < 3.0, "the caller blocked on an orphan's inherited pipes"
        assert host_pids_with(marker) == [], f"daemon 'sleep {marker}' survived the call"


def test_orphan_holding_the_pipes_does_not_block_the_caller(sandbox: Sandbox) -> None:
    require(sandbox, "orphans")
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    code = f"""
import os
try:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{marker}"])  # keeps stdout/stderr open
        os._exit(0)
except (AttributeError, OSError):
    pass
print("parent done")
"""
    res = sandbox.run_python(code)
    assert "parent done" in res.stdout
    assert res.duration_s < 3.0
    assert host_pids_with(marker) == []


def test_output_flood_is_capped_and_caller_memory_bounded(sandbox: Sandbox) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    res = sandbox.run_python(
        """
import os, sys
chunk = "y" * (1 << 20)
for _ in range(64):
    sys.stdout.write(chunk)
    sys.stderr.write(chunk)
"""
    )
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert res.output_truncated
    assert len(res.stdout.encode()) <= LIMITS.output_bytes and len(res.stderr.encode()) <= LIMITS.output_bytes
    assert res.stdout.startswith("y" * 1000)
    assert grown_mb < 32, f"caller grew by {grown_mb:.0f} MiB reading a 128 MiB flood"


def test_no_descendant_survives_any_probe() -> None:
    """Runs last in this module: no fork-bomb child of any backend is still alive on the host."""
    assert host_pids_with(BOMB_MARK) == []


if os.geteuid() != 0:  # the probes above start sandboxes that need root
    pytestmark = pytest.mark.skip(reason="the sandbox threat suite needs root")
