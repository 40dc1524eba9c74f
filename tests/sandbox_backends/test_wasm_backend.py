"""WASI backend: one property per test (see ``arborl/sandbox/wasm.py`` for the threat model).

Errno values are WASI's, not Linux's: ENOENT = 44, ENOSPC = 51, EPERM = 63, ENOTCAPABLE = 76.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from backendkit import SITE_BUILTINS

from arborl.sandbox import _wasm_runtime as rt
from arborl.sandbox.base import Limits, SandboxError
from arborl.sandbox.uids import UID_RANGE
from arborl.sandbox.wasm import WasmBackend

LIMITS = Limits(wall_s=3.0, cpu_s=2.0, memory_mb=64, disk_mb=4, output_bytes=4096)


@pytest.fixture(scope="module")
def backend(wasm_ready: str) -> Iterator[WasmBackend]:
    b = WasmBackend(LIMITS, pool_size=1)
    yield b
    b.close()


@pytest.fixture
def writable(backend: WasmBackend) -> WasmBackend:
    if not backend.writable:
        pytest.skip("not root: the scratch is read-only here (no size-capped tmpfs can be mounted)")
    return backend


def arborl_mounts() -> list[str]:
    with open("/proc/mounts") as f:
        return [line for line in f if line.startswith("arborl-wasm ")]


def test_stdin_stdout_exit_code(backend: WasmBackend) -> None:
    r = backend.run_python("import sys\nprint(sys.stdin.read()[::-1])\nsys.exit(3)", stdin="abc")
    assert (r.stdout, r.exit_code, r.ok, r.backend) == ("cba\n", 3, False, "wasm")


def test_traceback_names_the_snippet_line(backend: WasmBackend) -> None:
    r = backend.run_python("x = 1\ny = x / 0")
    assert r.exit_code == 1 and 'line 2, in <module>\n    y = x / 0' in r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


def test_files_are_visible_and_nothing_persists(writable: WasmBackend) -> None:
    first = writable.run_python("open('left.txt', 'w').write('x')\nprint(open('in/data.txt').read())",
                                files={"in/data.txt": b"hello"})
    second = writable.run_python("import os\nprint(sorted(os.listdir('.')))")
    assert (first.stdout, second.stdout) == ("hello\n", "[]\n")
    assert arborl_mounts() == []  # each run's tmpfs is unmounted afterwards


def test_cpu_loop_traps_at_the_epoch_deadline(backend: WasmBackend) -> None:
    t0 = time.monotonic()
    r = backend.run_python("while True: pass")
    assert r.timed_out and not r.ok and time.monotonic() - t0 < LIMITS.cpu_s + 1.0


def test_blocking_sleep_is_killed_at_the_wall_deadline(backend: WasmBackend) -> None:
    t0 = time.monotonic()
    r = backend.run_python("import time\nprint('before', flush=True)\ntime.sleep(60)")
    assert r.timed_out and r.exit_code == -9 and time.monotonic() - t0 < LIMITS.wall_s + 1.0
    assert r.stdout == "before\n"
    assert backend.run_python("print(2)").stdout == "2\n"  # the killed worker was replaced


def test_memory_limit(backend: WasmBackend) -> None:
    r = backend.run_python("x = bytearray(200 << 20)\nprint('survived')")
    assert r.memory_exceeded and not r.ok and "survived" not in r.stdout


def test_disk_quota_is_real(writable: WasmBackend) -> None:
    code = """
written = 0
try:
    with open("big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20)); f.flush(); written += 1
except OSError as e:
    print(e.errno, written)
"""
    r = writable.run_python(code)
    errno_, mib = r.stdout.split()
    assert errno_ == "51" and int(mib) <= LIMITS.disk_mb  # WASI ENOSPC at the tmpfs size


def test_many_small_files_hit_the_inode_cap(writable: WasmBackend) -> None:
    code = """
n = 0
try:
    for n in range(100000):
        open(f"f{n}", "w").close()
except OSError as e:
    print(e.errno, n)
"""
    errno_, n = writable.run_python(code).stdout.split()
    assert errno_ == "51" and int(n) <= max(1024, LIMITS.disk_mb * 256)


def test_no_host_files_no_network_no_env(backend: WasmBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    code = """
import json, os, socket
res = {"env": "SECRET_TOKEN" in os.environ}
try:
    res["root"] = os.listdir("/")
except OSError as e:
    res["root"] = e.errno
for p in ("/etc/passwd", "/proc/self/environ", "../../etc/passwd"):
    try:
        open(p).read(); res[p] = "read"
    except OSError as e:
        res[p] = e.errno
try:
    socket.create_connection(("127.0.0.1", 22), timeout=1); res["tcp"] = "connected"
except Exception as e:
    res["tcp"] = type(e).__name__
print(json.dumps(res))
"""
    res = json.loads(backend.run_python(code).stdout)
    assert res["env"] is False
    assert res["root"] == 44  # only the two preopens exist; "/" itself is not a directory here
    assert res["/etc/passwd"] == 44 and res["/proc/self/environ"] == 44
    assert res["../../etc/passwd"] in (44, 63, 76)  # ENOENT, EPERM or ENOTCAPABLE: never read
    assert res["tcp"] != "connected"


def test_proxy_socket_is_refused(wasm_ready: str) -> None:
    with pytest.raises(SandboxError, match="no network"):
        WasmBackend(LIMITS, proxy_socket="/tmp/proxy.sock")


def test_output_is_capped(backend: WasmBackend) -> None:
    r = backend.run_python("import sys\nsys.stdout.write('a' * 100000)\nsys.stderr.write('b' * 100000)")
    assert r.ok and r.output_truncated
    assert r.stdout == "a" * LIMITS.output_bytes and r.stderr == "b" * LIMITS.output_bytes


def test_read_only_mode_reads_files_and_writes_nothing(wasm_ready: str) -> None:
    with WasmBackend(LIMITS, writable=False, pool_size=1) as b:
        r = b.run_python("print(open('d.txt').read())\nopen('new.txt', 'w')", files={"d.txt": b"ro"})
    assert r.stdout == "ro\n" and r.exit_code == 1 and "new.txt" in r.stderr


def test_compiled_module_is_reused(wasm_ready: str) -> None:
    cached = rt.compiled_module(wasm_ready)
    mtime = os.stat(cached).st_mtime_ns
    t0 = time.monotonic()
    with WasmBackend(LIMITS, pool_size=1) as b:
        assert b.run_python("print(1)").stdout == "1\n"
    assert time.monotonic() - t0 < 5.0  # compiling would take 7-11 s
    assert rt.compiled_module(wasm_ready) == cached and os.stat(cached).st_mtime_ns == mtime


@pytest.mark.slow
def test_fresh_cache_compiles_once(wasm_ready: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORL_CACHE_DIR", str(tmp_path))
    (tmp_path / "wasm").mkdir(mode=0o700)
    path = rt.compiled_module(wasm_ready)
    assert path.startswith(str(tmp_path)) and os.path.getsize(path) > 1 << 20
    t0 = time.monotonic()
    assert rt.compiled_module(wasm_ready) == path and time.monotonic() - t0 < 1.0


def test_cache_writable_by_others_is_refused(wasm_ready: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORL_CACHE_DIR", str(tmp_path))
    (tmp_path / "wasm").mkdir()
    os.chmod(tmp_path / "wasm", 0o777)
    with pytest.raises(SandboxError, match="writable by others"):
        rt.compiled_module(wasm_ready)


def test_workers_die_with_their_owner(wasm_ready: str) -> None:
    script = """
import time
from arborl.sandbox.base import Limits
from arborl.sandbox.wasm import WasmBackend
b = WasmBackend(Limits(), pool_size=2)
print(b._dir, " ".join(str(w.proc.pid) for w in b._workers), flush=True)
time.sleep(60)
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    private_dir, *pids_text = p.stdout.readline().split()
    pids = [int(x) for x in pids_text]
    p.kill()  # no close()
    p.wait()

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/status") as f:
                return "\nState:\tZ" not in f.read()
        except FileNotFoundError:
            return False

    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, pids))
    # Each worker removed its run files; left are empty directories (the scratch mountpoints,
    # which nobody can remove while the worker's mount namespace holds them).
    leftover = [os.path.join(d, f) for d, _, files in os.walk(private_dir) for f in files]
    assert leftover == []
    shutil.rmtree(private_dir, ignore_errors=True)


def test_killed_run_leaves_no_mount_and_files_too_big_are_an_error(writable: WasmBackend) -> None:
    assert writable.run_python("import time\ntime.sleep(60)").timed_out
    assert arborl_mounts() == []  # the mounts live in the worker's own mount namespace
    big = {"big.bin": b"x" * ((LIMITS.disk_mb + 1) << 20)}
    r = writable.run_python("print(1)", files=big)
    assert not r.ok and r.error is not None and "do not fit" in r.error
    assert writable.run_python("print(1)").stdout == "1\n"


def test_small_memory_limit_is_checked_and_not_misreported(wasm_ready: str) -> None:
    with pytest.raises(SandboxError, match="memory_mb >= 16"):
        WasmBackend(Limits(memory_mb=8))
    with WasmBackend(Limits(memory_mb=16), pool_size=1) as b:
        r = b.run_python("1/0")
    assert r.exit_code == 1 and not r.memory_exceeded and "ZeroDivisionError" in r.stderr


def test_writable_workers_run_as_sandbox_uids_without_capabilities(writable: WasmBackend) -> None:
    assert writable.run_python("print(1)").ok  # make sure a worker is up and has served a run
    for w in list(writable._workers):
        with open(f"/proc/{w.proc.pid}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        uid = int(status["Uid"].split()[0])
        assert uid in UID_RANGE and status["Uid"].split() == status["Gid"].split() == [str(uid)] * 4, status
        assert status["CapEff"].strip() == "0000000000000000" and status["NoNewPrivs"].strip() == "1"


def test_each_writable_worker_has_a_uid_of_its_own(writable: WasmBackend) -> None:
    # A wasm snippet has no uid to report (no processes, no signals): read the workers' from the host.
    with WasmBackend(LIMITS, pool_size=3) as pool:
        workers = list(pool._workers)
        uids = set()
        for w in workers:
            with open(f"/proc/{w.proc.pid}/status") as f:
                uids.add(next(line.split()[1] for line in f if line.startswith("Uid:")))
    assert len(workers) == 3 and len(uids) == 3, uids


def test_concurrent_runs_from_threads(backend: WasmBackend) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda i: backend.run_python(f"print({i} * 7)"), range(6)))
    assert [r.stdout for r in results] == [f"{i * 7}\n" for i in range(6)]


def test_site_builtins_exit_quit_help(backend: WasmBackend) -> None:
    first, second = (backend.run_python(code) for code in SITE_BUILTINS)
    assert (first.stdout, first.exit_code, second.exit_code) == ("True\n", 3, 4)
