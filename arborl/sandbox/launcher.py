"""The first code that runs inside a sandbox: unpack one request, then run the snippet.

This file is shipped as *source text* into the sandbox (``python3 -I -c SOURCE``, or exec'd by the
zygote), so it imports nothing from arborl and only uses the standard library of Debian's system
Python. A request (a ``marshal``-ed dict of str/bytes built by the trusted parent; decoding goes
parent -> sandbox, never the other way) carries:

- ``code``: the snippet, run as ``__main__`` from ``/tmp/main.py`` (the scratch directory);
- ``files``: ``{relative path: bytes}`` written into the scratch directory first;
- ``relay_src`` / ``proxy_socket``: when set, the TCP->unix-socket relay of :mod:`arborl.proxy.relay`
  is started on ``127.0.0.1:3128`` in a daemon thread and ``HTTP(S)_PROXY`` point at it.

What it isolates: nothing. Isolation comes from the backend that started this process
(namespaces, seccomp, cgroups, rlimits); this module only prepares the process and reports the
exit status like ``python3 main.py`` would (tracebacks, ``SystemExit`` codes, atexit handlers).

stdin is a memfd of its own that the parent filled (writing it here would be cut at RLIMIT_FSIZE,
i.e. ``disk_mb``); it becomes fd 0, so the parent never blocks writing a pipe. The launcher makes
the process non-dumpable first (:func:`make_undumpable`).
"""

from __future__ import annotations

# Only modules the interpreter has loaded anyway at startup: every import here costs each run.
import marshal
import os
import sys

SCRATCH = "/tmp"
MAIN_PATH = "/tmp/main.py"
RELAY_PORT = 3128
PROXY_URL = "http://127.0.0.1:3128"


def bpf_loader(bpf: bytes):  # -> Callable[[], None]; untyped import-free for old Pythons
    """Prepare a seccomp program now; the returned function installs it (prctl only).

    Building the ``sock_fprog`` ahead keeps the call cheap and allocation-free, which matters
    when it runs in a ``preexec_fn`` or a freshly forked child.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = SockFprog(len(bpf) // 8, ctypes.addressof(buf))

    def load() -> None:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

    load.keep = (buf, prog)  # type: ignore[attr-defined]  # the program must outlive the call
    return load


def make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)``: no other process of the same uid may ptrace this one or open
    its ``/proc/PID/{root,cwd,mem,environ,fd}``; its ``/proc/PID`` files belong to root.

    ``exec`` makes a process dumpable again, so every interpreter that runs a snippet calls this
    at its start (children it forks inherit it). Through the bare ``_ctypes`` module (0.7 ms),
    not ``ctypes`` (5-13 ms): this runs on every cold start.
    """
    import _ctypes

    class _Int(_ctypes._SimpleCData):  # type: ignore[name-defined,misc]
        _type_ = "i"

    class _Func(_ctypes.CFuncPtr):  # type: ignore[name-defined,misc]
        _flags_ = _ctypes.FUNCFLAG_CDECL
        _restype_ = _Int

    prctl = _Func(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))
    if prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, SUID_DUMP_DISABLE
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


def read_fd(fd: int) -> bytes:
    """Read an fd to EOF and close it."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def write_files(files: dict[str, bytes], root: str = SCRATCH) -> None:
    """Write the caller's files below ``root`` (names were validated by the parent).

    The one copy: the wasm worker imports it from here (this module is stdlib-only, so it can).
    """
    for name, data in files.items():
        path = os.path.join(root, name)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)


def start_relay(relay_src: str, socket_path: str) -> None:
    """Start the proxy relay in a daemon thread; return once its port is bound.

    Binding happens here, synchronously (``make_server``), so the snippet can connect at once.
    """
    import threading

    namespace: dict = {"__name__": "arborl_relay"}
    exec(compile(relay_src, "arborl_relay.py", "exec"), namespace)
    server = namespace["make_server"](socket_path, RELAY_PORT)
    threading.Thread(target=server.serve_forever, name="arborl-relay", daemon=True).start()
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        os.environ[var] = PROXY_URL
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ""


def finish(code: int) -> None:
    """Leave like the interpreter would: join threads, run atexit handlers, flush, exit."""
    import atexit

    try:
        threading = sys.modules.get("threading")  # no threading module loaded: no threads to join
        if threading is not None:
            threading._shutdown()  # type: ignore[attr-defined]  # waits for non-daemon threads
        atexit._run_exitfuncs()
    except BaseException:  # the snippet's handlers may raise anything
        pass
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib would be one more import per run
            stream.flush()
        except BaseException:  # a closed or broken stream must not hide the exit status
            pass
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    """Map ``SystemExit.code`` to a process status the way CPython does."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    try:  # noqa: SIM105 - contextlib would be one more import per run
        print(exc.code, file=sys.stderr)
    except BaseException:  # str() of an arbitrary object may raise
        pass
    return 1


def run_snippet(code: str) -> None:
    """Run ``code`` as ``__main__`` from ``/tmp/main.py`` and exit the process with its status."""
    with open(MAIN_PATH, "w", encoding="utf-8") as fh:
        fh.write(code)
    main = type(sys)("__main__")
    main.__file__ = MAIN_PATH
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    sys.argv = [MAIN_PATH]
    sys.path[0:0] = [SCRATCH]
    status = 0
    try:
        exec(compile(code, MAIN_PATH, "exec"), main.__dict__)
    except SystemExit as exc:
        status = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - report any failure like the interpreter does
        import traceback

        # Drop this frame so the traceback starts in the snippet, as with ``python3 main.py``.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        status = 1
    finish(status)


def prepare(request: dict) -> None:
    """Everything before the snippet: cwd, files, relay (stdin is already fd 0)."""
    os.chdir(SCRATCH)
    write_files(request.get("files") or {})
    if request.get("relay_src") and request.get("proxy_socket"):
        start_relay(request["relay_src"], request["proxy_socket"])


class _Quitter:
    """``exit`` / ``quit`` as ``site`` defines them (the one-shot interpreter runs with ``-S``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code: object = None) -> None:
        try:  # noqa: SIM105 - contextlib would be one more import per run
            sys.stdin.close()
        except Exception:
            pass
        raise SystemExit(code)


def _help(*args: object, **kwargs: object) -> object:
    import pydoc

    return pydoc.help(*args, **kwargs)


def minimal_site() -> None:
    """What ``site`` gives a snippet, without its cost (``-S`` saves 3-7 ms per run).

    Adds Debian's system package directories to ``sys.path`` (no ``.pth`` processing) and the
    ``exit``, ``quit`` and ``help`` builtins.
    """
    import builtins

    ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for path in (f"/usr/local/lib/python{ver}/dist-packages", "/usr/lib/python3/dist-packages",
                 f"/usr/lib/python{ver}/dist-packages"):  # fmt: skip
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)
    builtins.exit = _Quitter("exit")  # type: ignore[attr-defined]
    builtins.quit = _Quitter("quit")  # type: ignore[attr-defined]
    builtins.help = _help  # type: ignore[attr-defined]


def main() -> None:
    """Entry point inside a one-shot sandbox: ``python3 -I -S -c SOURCE PAYLOAD_FD STDIN_FD [GO_FD]``.

    With ``GO_FD`` the interpreter was started before its request existed (a spare sandbox):
    it blocks until the parent writes one byte there (the request and stdin are then in their
    memfds) or closes it (the spare is not needed: exit quietly).
    """
    make_undumpable()
    if "site" not in sys.modules:
        minimal_site()
    if len(sys.argv) > 3 and not os.read(int(sys.argv[3]), 1):
        os._exit(0)
    request = marshal.loads(read_fd(int(sys.argv[1])))
    os.dup2(int(sys.argv[2]), 0)
    # Nothing the parent holds (cgroup files, the seccomp fd) must stay reachable from the snippet.
    os.closerange(3, 1 << 16)
    prepare(request)
    run_snippet(request["code"])


if __name__ == "__main__":
    main()
