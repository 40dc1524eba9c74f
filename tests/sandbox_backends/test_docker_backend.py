"""Docker backend: one property per test, against a private dockerd (see conftest.py).

Expectations are hand-derived from the container flags in ``arborl/sandbox/docker.py``:
a uid/gid of the reserved sandbox range (``arborl.sandbox.uids``), read-only root (EROFS = errno 30), no network interface but ``lo``, pids and
memory cgroup limits, a size-capped /scratch tmpfs, kill-and-replace at the deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from backendkit import SITE_BUILTINS, FakeProxy, docker_cli

from arborl.sandbox import seccomp
from arborl.sandbox._docker_image import ensure_image
from arborl.sandbox.base import Limits, SandboxError
from arborl.sandbox.docker import DockerBackend
from arborl.sandbox.uids import UID_RANGE

LIMITS = Limits(wall_s=3.0, cpu_s=2.0, memory_mb=128, pids=32, disk_mb=8, output_bytes=4096)

# Prints this container's id (from its cgroup path) so tests can tell pool containers apart.
CONTAINER_ID = "print(open('/proc/self/cgroup').read().split('/docker/')[1].split()[0][:12])"


@pytest.fixture(scope="module")
def backend(docker_host: str) -> Iterator[DockerBackend]:
    b = DockerBackend(LIMITS, docker_host=docker_host, pool_size=1)
    yield b
    b.close()


def owned(host: str, b: DockerBackend) -> list[str]:
    out = docker_cli(host, "ps", "-aq", "--filter", f"label=arborl.sandbox.owner={b._owner}").stdout
    return out.split()


def test_probe_reports_a_missing_daemon() -> None:
    reason = DockerBackend.probe(docker_host="unix:///nonexistent/docker.sock")
    assert reason is not None and "scripts/setup/docker.sh" in reason


def test_stdin_stdout_exit_code(backend: DockerBackend) -> None:
    r = backend.run_python("import sys\nprint(sys.stdin.read()[::-1])\nsys.exit(3)", stdin="abc")
    assert (r.stdout, r.exit_code, r.ok, r.backend) == ("cba\n", 3, False, "docker")


def test_user_name_resolves_without_a_passwd_entry_for_the_uid(backend: DockerBackend) -> None:
    # The container's uid is leased per container, so the image's /etc/passwd cannot name it.
    r = backend.run_python("import getpass, os, pwd\ntry:\n    pwd.getpwuid(os.getuid())\nexcept KeyError:\n"
                           "    print('no entry')\nprint(getpass.getuser())")
    assert (r.stdout, r.exit_code) == ("no entry\nnobody\n", 0), r


def test_identity_readonly_root_and_no_network(backend: DockerBackend) -> None:
    code = """
import errno, json, os, socket
res = {"uid": os.getuid(), "gid": os.getgid(), "ifaces": sorted(n for _, n in socket.if_nameindex())}
try:
    open("/usr/evil", "w")
except OSError as e:
    res["write_root"] = e.errno
try:
    socket.create_connection(("192.0.2.1", 80), timeout=2)
except OSError as e:
    res["tcp"] = e.errno
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
res["capeff"] = status["CapEff"].strip()
res["nnp"] = status["NoNewPrivs"].strip()
res["env"] = sorted(os.environ)
print(json.dumps(res))
"""
    r = backend.run_python(code)
    assert r.ok, r.stderr
    res = json.loads(r.stdout)
    assert res["uid"] == res["gid"] and res["uid"] in UID_RANGE, (res["uid"], res["gid"])
    assert res["ifaces"] == ["lo"]
    assert res["write_root"] == 30  # EROFS
    # EPERM: the seccomp profile refuses AF_INET without a proxy. That --network none leaves no
    # route either (ENETUNREACH) is checked where AF_INET is allowed: the proxy test.
    assert res["tcp"] == 1
    assert res["capeff"] == "0000000000000000"
    assert res["nnp"] == "1"
    assert res["env"] == ["HOME", "LANG", "PATH", "TMPDIR", "USER"]  # nothing from the host


def test_files_are_visible_and_nothing_persists(backend: DockerBackend) -> None:
    first = backend.run_python(
        "import os, subprocess, sys\n"
        "open('left.txt', 'w').write('x')\n"
        # a daemon that outlives the snippet: double fork + setsid, stdout closed
        "subprocess.Popen([sys.executable, '-c', 'import os,time\\nif os.fork(): os._exit(0)\\nos.setsid()\\n"
        "time.sleep(60)'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()\n"
        + CONTAINER_ID,
        files={"in/data.txt": b"hello"})
    second = backend.run_python(
        "import os\n"
        "print(sorted(os.listdir('.')), open('in/data.txt').read())\n"
        "state = lambda p: open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "live = [p for p in os.listdir('/proc') if p.isdigit() and state(p) != 'Z']\n"
        "print(len(live))\n" + CONTAINER_ID,
        files={"in/data.txt": b"again"})
    assert first.ok and second.ok, (first.stderr, second.stderr)
    lines = second.stdout.splitlines()
    assert lines[0] == "['in'] again"  # left.txt of the first run is gone
    # pid 1 (reaper), the runner, this snippet: the daemon of the first run was killed (zombies,
    # dead and not yet reaped, are not counted)
    assert lines[1] == "3"
    assert lines[2] == first.stdout.strip()  # same pool container, reused


def test_cpu_loop_and_sleep_hit_the_deadline(backend: DockerBackend) -> None:
    t0 = time.monotonic()
    spin = backend.run_python("while True: pass")
    t1 = time.monotonic()
    sleep = backend.run_python("import time; time.sleep(60)")
    t2 = time.monotonic()
    assert spin.timed_out and not spin.ok and t1 - t0 < LIMITS.cpu_s + 1.5
    assert sleep.timed_out and not sleep.ok and t2 - t1 < LIMITS.wall_s + 1.5


def test_deadline_kills_and_replaces_the_container(docker_host: str, backend: DockerBackend) -> None:
    before = backend.run_python(CONTAINER_ID).stdout.strip()
    # Stop the in-container runner (same uid) so only the host-side deadline can end the run.
    t0 = time.monotonic()
    r = backend.run_python("import os, signal, time\nos.kill(os.getppid(), signal.SIGSTOP)\ntime.sleep(60)")
    assert r.timed_out and time.monotonic() - t0 < LIMITS.wall_s + 2.5
    deadline = time.monotonic() + 10
    while any(c.startswith(before) for c in owned(docker_host, backend)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(c.startswith(before) for c in owned(docker_host, backend))
    after = backend.run_python(CONTAINER_ID)
    assert after.ok and after.stdout.strip() != before


def test_memory_limit(backend: DockerBackend) -> None:
    r = backend.run_python("x = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint('survived')")
    assert r.memory_exceeded and not r.ok and "survived" not in r.stdout


def test_pids_limit(backend: DockerBackend) -> None:
    code = """
import os, time
n = 0
for _ in range(200):
    try:
        if os.fork() == 0:
            time.sleep(5); os._exit(0)
        n += 1
    except OSError:
        break
print(n)
"""
    r = backend.run_python(code)
    assert int(r.stdout) + 1 == LIMITS.pids  # the snippet plus its children fill the limit exactly


def test_disk_cap_and_no_dev_shm(backend: DockerBackend) -> None:
    code = """
import errno, os
written = 0
try:
    with open("big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20)); f.flush(); written += 1
except OSError as e:
    print(e.errno, written)
print(os.path.exists("/dev/shm"))
"""
    r = backend.run_python(code)
    first, second = r.stdout.split("\n")[:2]
    errno_, mib = first.split()
    assert errno_ == "28" and int(mib) <= LIMITS.disk_mb  # ENOSPC at the tmpfs size
    assert second == "False"


def test_output_is_capped(backend: DockerBackend) -> None:
    r = backend.run_python("import sys\nsys.stdout.write('a' * 100000)\nsys.stderr.write('b' * 100000)")
    assert r.ok and r.output_truncated
    assert r.stdout == "a" * LIMITS.output_bytes and r.stderr == "b" * LIMITS.output_bytes


def test_concurrent_runs_from_threads(backend: DockerBackend) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda i: backend.run_python(f"print({i} * 7)"), range(6)))
    assert [r.stdout for r in results] == [f"{i * 7}\n" for i in range(6)]


def test_cold_path_and_close_leave_no_container(docker_host: str) -> None:
    b = DockerBackend(LIMITS, docker_host=docker_host, warm=False)
    # The cold path gets the same seccomp profile: PTRACE_TRACEME (0) fails with EPERM (1).
    r = b.run_python(
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(os.getuid(), libc.ptrace(0, 0, 0, 0), ctypes.get_errno())"
    )
    uid, ret, err = r.stdout.split()
    assert int(uid) in UID_RANGE and (ret, err, r.exit_code) == ("-1", "1", 0), r
    assert owned(docker_host, b) == []  # --rm
    warm = DockerBackend(LIMITS, docker_host=docker_host, pool_size=2)
    assert len(owned(docker_host, warm)) == 2
    warm.close()
    assert owned(docker_host, warm) == []
    with pytest.raises(SandboxError, match="closed"):
        warm.run_python("print(1)")


def test_bad_file_name_is_refused(backend: DockerBackend) -> None:
    with pytest.raises(ValueError, match="relative path"):
        backend.run_python("print(1)", files={"../escape": b"x"})


def test_proxy_socket_is_the_only_way_out(docker_host: str, fake_proxy: FakeProxy) -> None:
    code = """
import json, os, socket, urllib.request
res = {"env": os.environ.get("HTTP_PROXY")}
res["body"] = urllib.request.urlopen("http://example.invalid/probe?x=1", timeout=5).read().decode()
try:
    socket.create_connection(("192.0.2.1", 80), timeout=1)
    res["direct"] = "connected"
except OSError as e:
    res["direct"] = e.errno
try:
    socket.socket(socket.AF_INET6)
    res["inet6"] = "created"
except OSError as e:
    res["inet6"] = e.errno
print(json.dumps(res))
"""
    with DockerBackend(LIMITS, docker_host=docker_host, pool_size=1, proxy_socket=fake_proxy.path) as b:
        r = b.run_python(code)
    assert r.ok, r.stderr
    res = json.loads(r.stdout)
    assert res["env"] == "http://127.0.0.1:3128"
    assert res["body"] == "proxied: GET http://example.invalid/probe?x=1 HTTP/1.1"
    assert fake_proxy.requests == ["GET http://example.invalid/probe?x=1 HTTP/1.1"]
    assert res["direct"] == 101  # ENETUNREACH: the profile lets AF_INET through for the relay
    assert res["inet6"] == 1  # EPERM: the profile refuses AF_INET6 even with a proxy


def test_a_dead_pool_container_is_replaced_without_failing_the_run(docker_host: str) -> None:
    with DockerBackend(LIMITS, docker_host=docker_host, pool_size=1) as b:
        victim = b._idle.get(timeout=0)
        assert victim is not None
        b._idle.put(victim)
        docker_cli(docker_host, "kill", victim)  # dies between runs, e.g. its pid 1 was killed
        r = b.run_python("print('fine')")
        assert (r.stdout, r.error) == ("fine\n", None)


def test_pool_of_a_sigkilled_owner_removes_itself(docker_host: str) -> None:
    script = f"""
import time
from arborl.sandbox.base import Limits
from arborl.sandbox.docker import DockerBackend
b = DockerBackend(Limits(), docker_host={docker_host!r}, pool_size=2, idle_ttl_s=1.0)
print(b._owner, flush=True)
time.sleep(60)
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    owner = p.stdout.readline().strip()
    p.kill()  # no close(), no finalizer
    p.wait()

    def left() -> list[str]:
        return docker_cli(docker_host, "ps", "-aq", "--filter", f"label=arborl.sandbox.owner={owner}").stdout.split()

    assert owner and len(left()) == 2
    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert left() == []


def test_runc_keeps_host_fds_out_of_workdir(docker_host: str, tmp_path) -> None:
    # CVE-2024-21626: a leaked host fd as WORKDIR put the process in the host's filesystem.
    canary = f"arborl-canary-{os.getpid()}"
    (tmp_path.parent / canary).write_text("host")  # reachable as ../../... from a host cwd
    probe = f"import os\nprint(any(os.path.exists('../' * d + '{tmp_path.parent.relative_to('/')}/{canary}') for d in range(1, 12)))"
    image = ensure_image(docker_host=docker_host)
    for fd in range(3, 10):
        r = docker_cli(docker_host, "run", "--rm", "--network", "none", "--user", "65534:65534",
                       "-w", f"/proc/self/fd/{fd}", image, "/usr/bin/python3", "-I", "-S", "-c", probe)
        assert r.returncode != 0 or r.stdout.strip() == "False", (fd, r.stdout, r.stderr)


def test_snippet_cannot_trace_or_read_its_runner(backend: DockerBackend) -> None:
    code = """
import ctypes, os
runner = os.getppid()
res = []
for path in (f"/proc/{runner}/mem", f"/proc/{runner}/environ"):
    try:
        open(path, "rb").read(1); res.append("read")
    except OSError as e:
        res.append(e.errno)
try:
    os.listdir(f"/proc/{runner}/fd"); res.append("read")
except OSError as e:
    res.append(e.errno)
libc = ctypes.CDLL(None, use_errno=True)
res.append(libc.ptrace(16, runner, 0, 0))  # PTRACE_ATTACH
res.append(ctypes.get_errno())
print(res)
"""
    r = backend.run_python(code)
    assert r.ok, r.stderr
    assert r.stdout.strip() == "[13, 13, 13, -1, 1]"  # EACCES x3, then ptrace fails with EPERM


def test_files_larger_than_the_scratch_are_an_error(backend: DockerBackend) -> None:
    r = backend.run_python("print(1)", files={"big.bin": b"x" * ((LIMITS.disk_mb + 1) << 20)})
    assert not r.ok and r.error is not None and "do not fit" in r.error
    assert backend.run_python("print(1)").stdout == "1\n"


def test_site_builtins_exit_quit_help(backend: DockerBackend) -> None:
    first, second = (backend.run_python(code) for code in SITE_BUILTINS)
    assert (first.stdout, first.exit_code, second.exit_code) == ("True\n", 3, 4)


def test_profile_is_the_seccomp_rule_list() -> None:
    for allow_inet in (False, True):
        prof = seccomp.docker_profile(allow_inet=allow_inet)
        assert prof["defaultAction"] == "SCMP_ACT_ALLOW" and "architectures" not in prof
        got = [(e["names"], e["errnoRet"], e.get("args")) for e in prof["syscalls"]]
        assert len(got) == len(seccomp.rules(allow_inet=allow_inet))
        assert all(e["action"] == "SCMP_ACT_ERRNO" for e in prof["syscalls"])
        assert (["ptrace"], 1, None) in got and (["syslog"], 1, None) in got  # EPERM
        assert (["clone3"], 38, None) in got  # ENOSYS: glibc falls back to clone
        # libseccomp order for MASKED_EQ: value = mask, valueTwo = datum (TIOCSTI = 0x5412 = 21522).
        tiocsti = [{"index": 1, "value": 0xFFFFFFFF, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ"}]
        assert (["ioctl"], 1, tiocsti) in got
        families = [a[0]["value"] for n, _, a in got if n == ["socket"]]
        assert families == ([10] if allow_inet else [2, 10])  # AF_INET6 always, AF_INET without proxy


def test_foreign_arch_syscall_kills_the_snippet(docker_host: str) -> None:
    # i386 ``int 0x80`` ptrace(TRACEME) from x86_64: not in the native-only filter, so SIGSYS (31).
    code = """
import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes([0x53, 0xB8, 26, 0, 0, 0, 0xBB, 0, 0, 0, 0, 0xCD, 0x80, 0x5B, 0xC3]))
print("returned", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())
"""
    if os.uname().machine != "x86_64":
        pytest.skip("the probe is x86_64 machine code")
    with DockerBackend(LIMITS, docker_host=docker_host, pool_size=1) as b:
        with open(b._seccomp_path, encoding="utf-8") as fh:
            assert json.load(fh) == seccomp.docker_profile(allow_inet=False)
        assert os.stat(os.path.dirname(b._seccomp_path)).st_mode & 0o777 == 0o700
        r = b.run_python(code)
    assert (r.exit_code, r.stdout) == (-31, ""), r
