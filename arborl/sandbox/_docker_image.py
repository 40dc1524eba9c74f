"""The docker sandbox image, built locally without a registry (``docker import`` of a tiny rootfs),
and the three small programs that run in it: the pid-1 reaper, the per-run runner, the snippet boot.

The rootfs holds only what ``python3`` needs: the host's interpreter binary, the shared libraries
that it and its stdlib extension modules load (found with ``ldd``), the stdlib (without tests,
tkinter, idle and the build config), ``/etc/passwd`` and ``/etc/group`` with ``nobody``, and an
empty ``/scratch`` mount point. No shell, no package manager, no setuid binary.

The tar is reproducible for a given host interpreter: entries sorted, owner root, mtimes those of the
host files (stdlib ``.pyc`` files are validated against them). The tag
``arborl/sandbox-python:<IMAGE_SCHEMA>-py<version>`` changes whenever this recipe or the
interpreter version changes, so an old image is never reused by mistake.
"""

from __future__ import annotations

import io
import os
import platform
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from arborl.sandbox.base import SandboxError

IMAGE_SCHEMA = 2
"""Bump when the recipe below changes."""

HOST_PYTHON = "/usr/bin/python3"
"""The distribution's interpreter (its stdlib lives on world-readable system paths)."""

_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
                "dist-packages", "__phello__", "pydoc_data"}
_PASSWD = b"root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/scratch:/usr/sbin/nologin\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


def _host_python_version(python: str = HOST_PYTHON) -> tuple[str, str]:
    """(full version, stdlib dir) of the host interpreter the image is made from."""
    if not os.path.exists(python):
        raise SandboxError(f"{python} not found; install the distribution's python3 (apt-get install python3)")
    out = subprocess.run(
        [python, "-I", "-S", "-c", "import sys,sysconfig;print(sys.version.split()[0]);print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1]


def image_tag(python: str = HOST_PYTHON) -> str:
    """Tag of the image built from ``python`` with the current recipe."""
    return f"arborl/sandbox-python:{IMAGE_SCHEMA}-py{_host_python_version(python)[0]}"


def _ldd(paths: list[str]) -> set[str]:
    """Absolute paths of the shared libraries (and the loader) that ``paths`` load."""
    libs: set[str] = set()
    out = subprocess.run(["ldd", *paths], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.add(m.group(1))
    return libs


def _walk_stdlib(stdlib: str) -> Iterator[str]:
    for dirpath, dirs, files in os.walk(stdlib):
        rel = os.path.relpath(dirpath, stdlib)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in _STDLIB_SKIP and not d.startswith("config-")]
        dirs.sort()
        for f in sorted(files):
            yield os.path.join(dirpath, f)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: int = 0) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), mode, mtime
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def build_rootfs_tar(dest: str, python: str = HOST_PYTHON) -> None:
    """Write the reproducible rootfs tar of the sandbox image to ``dest``."""
    version, stdlib = _host_python_version(python)
    pyc_suffix = ".cpython-{}{}.pyc".format(*version.split(".")[:2])
    binary = os.path.realpath(python)
    stdlib_files = list(_walk_stdlib(stdlib))
    modules = [f for f in stdlib_files if f.endswith(".so")]
    files = {binary: binary, "/usr/bin/python3": binary}
    for lib in _ldd([binary, *modules]):
        files[lib] = os.path.realpath(lib)  # the file's content under the name the loader asks for
    for f in stdlib_files:
        if "__pycache__" in f and not f.endswith(pyc_suffix):
            continue
        files[f] = os.path.realpath(f)
    dirs = {"/etc", "/scratch", "/tmp", "/run", "/run/arborl"}
    for name in files:
        d = os.path.dirname(name)
        while d not in ("/", ""):
            dirs.add(d)
            d = os.path.dirname(d)
    with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as tar:
        for d in sorted(dirs):
            _add_dir(tar, d, 0o1777 if d in ("/scratch", "/tmp") else 0o755)
        _add_bytes(tar, "/etc/passwd", _PASSWD, 0o644)
        _add_bytes(tar, "/etc/group", _GROUP, 0o644)
        for name in sorted(files):
            with open(files[name], "rb") as fh:
                data = fh.read()
            st = os.stat(files[name])
            # Keep the source mtime: .pyc files record it, and a mismatch makes every import
            # recompile (the read-only root cannot cache the result).
            _add_bytes(tar, name, data, st.st_mode & 0o755, int(st.st_mtime))


def image_exists(*, docker_host: str | None = None, tag: str | None = None) -> bool:
    """Whether the daemon already has the sandbox image."""
    cmd = ["docker", *(["--host", docker_host] if docker_host else []), "image", "inspect",
           tag or image_tag()]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def ensure_image(*, docker_host: str | None = None, python: str = HOST_PYTHON) -> str:
    """Build and ``docker import`` the sandbox image unless the daemon has it; returns its tag."""
    tag = image_tag(python)
    if image_exists(docker_host=docker_host, tag=tag):
        return tag
    if platform.system() != "Linux":
        raise SandboxError("the docker sandbox image is built from a Linux host's python3; build it on Linux")
    with tempfile.TemporaryDirectory(prefix="arborl-image-") as tmp:
        rootfs = os.path.join(tmp, "rootfs.tar")
        build_rootfs_tar(rootfs, python)
        changes = ["ENV PATH=/usr/bin:/bin", "ENV LANG=C.UTF-8", "USER 65534:65534",
                   "WORKDIR /scratch", f"LABEL arborl.sandbox.image={IMAGE_SCHEMA}",
                   'CMD ["/usr/bin/python3"]']
        cmd = ["docker", *(["--host", docker_host] if docker_host else []), "import"]
        for c in changes:
            cmd += ["--change", c]
        r = subprocess.run([*cmd, rootfs, tag], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SandboxError(f"docker import failed ({r.stderr.strip()[:300]}); is dockerd running?")
    return tag


# -- programs run inside the container (passed with ``python3 -c``; stdlib only) ------------
# They cannot import arborl, so each keeps its own small helpers (the runner's ``readn`` and its
# capped relay loop stand for recv_exact and output.read_capped); only the scratch wipe is shared,
# shipped as the source of arborl/sandbox/scratch.py.

# pid 1 of a warm container: reaps orphans and otherwise sleeps. As pid 1 of its pid namespace it
# ignores signals it has no handler for, so the runner's kill(-1) never stops the container. It
# exits (and ``--rm`` removes the container) after idle_ttl_s without any other process, so a
# pool whose owner was SIGKILLed (no close(), no finalizer) does not outlive it for long.
REAPER = """
import os, signal, sys, time
ttl = float(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
last = time.monotonic()
while True:
    signal.sigtimedwait([signal.SIGCHLD], 1.0)  # wakes at once when an orphan dies
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if any(p.isdigit() and p != "1" for p in os.listdir("/proc")):
        last = time.monotonic()
    elif time.monotonic() - last > ttl:
        sys.exit(0)
"""

# Started by the runner as the snippet's interpreter. The snippet arrives on fd 3 (a memfd) so
# its size is not bound by argv limits; it runs in __main__ so pickling and threads behave.
BOOT = """
def _boot():
    import ctypes
    ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE 0: exec made this interpreter dumpable again
    import linecache, os, sys, traceback
    import builtins, _sitebuiltins  # what site (skipped: -S) would add for interactive use
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()
    src = os.fdopen(3, encoding="utf-8", errors="replace").read()
    linecache.cache["<snippet>"] = (len(src), None, src.splitlines(True), "<snippet>")
    sys.argv[:] = ["<snippet>"]
    sys.path.insert(0, "")
    main = sys.modules["__main__"].__dict__
    del main["_boot"]
    try:
        exec(compile(src, "<snippet>", "exec"), main)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<snippet>":
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)
_boot()
"""

# The per-run runner (the container's uid, inside the container). Protocol: stdin = 8-byte header length,
# JSON header, the files' bytes back to back, then the snippet's stdin. stdout = frames of
# 1-byte kind ("o"ut, "e"rr, "x" = final JSON status) + 4-byte length + data.
# It makes itself undumpable before any snippet exists: the snippet shares its uid, so without
# that it could read the runner's memory through /proc, or ptrace it if the seccomp profile ever
# let ptrace through, skip the final kill(-1) and leave a process behind that watches the next run.
# Before and after every run it cleans what outlives a run's processes in a warm container (its
# IPC and network namespaces are shared by all its runs): SysV IPC objects and POSIX message
# queues are removed, /scratch is wiped (arborl/sandbox/scratch.py, shipped here as source); then
# it lists what a later run could still see (``dirty``). A dirty container is never reused: before
# a run, the runner refuses it ("retry": the host retries on another container); after a run, the
# status names it and the host replaces the container. Sockets are counted with /proc/net/sockstat
# (per network namespace, and cheap). Socket state cannot be cleared by a process
# without privileges, so a run that leaves some costs its container (TIME_WAIT, the usual case, is
# never created: the container runs with net.ipv4.tcp_max_tw_buckets=0).
_RUNNER_HEAD = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0)  # PR_SET_DUMPABLE 0: the snippet (same uid) cannot ptrace or read us
import json, os, resource, selectors, signal, struct, subprocess, sys, time
"""
_RUNNER_BODY = r"""
def readn(n):
    buf = bytearray()
    while len(buf) < n:
        b = os.read(0, n - len(buf))
        if not b:
            sys.exit(70)
        buf += b
    return bytes(buf)
def frame(kind, data):
    view = memoryview(kind + struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(1, view):]
def others():  # live processes but pid 1 (the reaper) and this runner
    left = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) not in (1, os.getpid()):
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        left.append(p)
            except OSError:
                pass
    return left
def killall():  # kill(-1) until nothing is left (a process may fork while the first kill lands)
    deadline = time.monotonic() + 2.0
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not others() or time.monotonic() > deadline:
            return
        time.sleep(0.002)
def rows(path):  # the lines of a /proc table below its header
    try:
        with open(path) as f:
            return f.read().splitlines()[1:]
    except OSError:
        return []
def clear_ipc():  # every object is ours (same uid): IPC_RMID = 0 for shmctl, msgctl and semctl
    for kind, rm in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        for line in rows(f"/proc/sysvipc/{kind}"):
            rm(int(line.split()[1]), 0, 0)
    try:
        for name in os.listdir("/dev/mqueue"):
            os.unlink(os.path.join("/dev/mqueue", name))
    except OSError:
        pass
def sockets():  # sockets and TIME_WAITs of this network namespace: sockstat's per-namespace counters
    # (/proc/net/tcp would list them too, but walks the host's whole connection table: ~4 ms)
    n = 0
    for line in rows("/proc/net/sockstat") + rows("/proc/net/sockstat6"):
        proto, _, counters = line.partition(":")
        fields = counters.split()
        values = dict(zip(fields[::2], fields[1::2]))
        if proto.rstrip("6") in ("TCP", "UDP", "UDPLITE", "RAW"):
            n += int(values.get("inuse", 0)) + int(values.get("tw", 0))
    return n
def dirty(listening=0):  # what a later run could see of earlier ones; empty = the container may be reused
    found = ["processes"] if others() else []
    found += [f"sysv {kind}" for kind in ("shm", "msg", "sem") if rows(f"/proc/sysvipc/{kind}")]
    try:
        found += ["mqueue"] if os.listdir("/dev/mqueue") else []
    except OSError:
        pass
    found += ["scratch"] if os.listdir("/scratch") else []
    found += ["sockets"] if sockets() > listening else []
    return found
def clean(listening=0):  # listening: the runner's own relay socket, open during a proxied run
    killall()
    clear_ipc()
    wipe("/scratch")
    left, deadline = dirty(listening), time.monotonic() + 0.1
    while left == ["sockets"] and time.monotonic() < deadline:  # the relay closing its connections
        time.sleep(0.005)
        left = dirty(listening)
    return left
def oom_kills():  # cgroup v1, else v2: the container's OOM-kill counter
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as f:
                return int(dict(l.split() for l in f)["oom_kill"])
        except (OSError, KeyError, ValueError):
            pass
    return -1
req = json.loads(readn(struct.unpack(">Q", readn(8))[0]))
left = clean()
if left:
    frame(b"x", json.dumps({"error": f"container not clean before the run ({', '.join(left)})",
                            "retry": True}).encode())
    sys.exit(71)
try:
    for name, size in req["files"]:
        path = os.path.join("/scratch", name)
        data = readn(size)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
except OSError as e:
    frame(b"x", json.dumps({"error": f"the files passed in do not fit in the scratch dir ({e})"}).encode())
    sys.exit(72)
code = os.memfd_create("snippet", 0)
os.write(code, req["code"].encode("utf-8", "surrogatepass"))
os.lseek(code, 0, 0)
if code != 3:
    os.dup2(code, 3, inheritable=True)
if req.get("relay"):  # proxy: HTTP(S)_PROXY=127.0.0.1:3128 in here -> the bind-mounted unix socket
    import threading
    ns = {"__name__": "arborl_relay"}
    exec(compile(req["relay"], "arborl_relay.py", "exec"), ns)
    relay = ns["make_server"](req["proxy_socket"], 3128)
    threading.Thread(target=relay.serve_forever, daemon=True).start()
cpu = req["cpu_s"]
def limit():
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
oom0 = oom_kills()
t0 = time.monotonic()
p = subprocess.Popen([sys.executable, "-I", "-S", "-c", req["boot"]], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, pass_fds=(3,), cwd="/scratch", env=req["env"],
                     start_new_session=True, preexec_fn=limit)
sel = selectors.DefaultSelector()
sel.register(p.stdout, selectors.EVENT_READ, b"o")
sel.register(p.stderr, selectors.EVENT_READ, b"e")
sent = {b"o": 0, b"e": 0}
trunc = False
wall = False
cap = req["cap"]
while sel.get_map():
    if p.poll() is not None or time.monotonic() - t0 > req["wall_s"]:
        wall = wall or p.poll() is None
        killall()
    for key, _ in sel.select(0.05):
        data = os.read(key.fd, 65536)
        if not data:
            sel.unregister(key.fileobj)
            continue
        keep = data[: max(0, cap - sent[key.data])]
        trunc = trunc or len(keep) < len(data)
        sent[key.data] += len(keep)
        if keep:
            frame(key.data, keep)
rc = p.wait()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the snippet's (its only child): CPU limit
oom = oom_kills() - oom0 if oom0 >= 0 else 0
left = clean(1 if req.get("relay") else 0)
frame(b"x", json.dumps({"rc": rc, "trunc": trunc, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                        "oom": oom, "dirty": left}).encode())
"""
RUNNER = _RUNNER_HEAD + (Path(__file__).parent / "scratch.py").read_text() + _RUNNER_BODY
