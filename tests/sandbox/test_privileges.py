"""Probes: the snippet has no privileges to escalate with, and runs never see each other."""

from __future__ import annotations

import json
import threading

from sbutil import require, run_ok

from arborl.sandbox import Sandbox

PRIVS = r"""
import errno, json, os
res = {"uid": getattr(os, "getuid", lambda: -1)()}  # -1: no uids at all (wasm)
try:
    status = open("/proc/self/status").read()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    res.update(cap_eff=fields["CapEff"].strip(), cap_prm=fields["CapPrm"].strip(),
               seccomp=fields.get("Seccomp", "?").strip(), nnp=fields.get("NoNewPrivs", "?").strip())
except OSError as e:
    res["status"] = type(e).__name__
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
except Exception as e:  # no ctypes at all (wasm): nothing below is reachable
    libc = None
    res["ctypes"] = type(e).__name__
def call(name, nr, *args):
    r = libc.syscall(nr, *[ctypes.c_ulong(a) for a in args])
    res[name] = "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
if libc is not None:
    CLONE_NEWUSER = 0x10000000
    call("unshare_user", 272, CLONE_NEWUSER)
    call("ptrace_traceme", 101, 0, 0, 0, 0)
    call("mount", 165, 0, 0, 0, 0, 0)
    call("bpf", 321, 0, 0, 0)
    call("keyctl", 250, 0, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(b"x")
    r = libc.syscall(16, 0, ctypes.c_ulong(0x5412), buf)  # ioctl(0, TIOCSTI)
    res["tiocsti"] = errno.errorcode.get(ctypes.get_errno(), "?") if r < 0 else "ok"
    r = libc.syscall(16, 0, ctypes.c_ulong(0x5412 | (1 << 32)), buf)  # masked variant (CVE-2019-10063)
    res["tiocsti_masked"] = errno.errorcode.get(ctypes.get_errno(), "?") if r < 0 else "ok"
print(json.dumps(res))
"""


def test_no_capabilities_and_no_new_privs(sandbox: Sandbox) -> None:
    require(sandbox, "privileges")
    res = json.loads(run_ok(sandbox, PRIVS))
    assert res["uid"] != 0, res
    if "cap_eff" in res:
        assert int(res["cap_eff"], 16) == 0 and int(res["cap_prm"], 16) == 0, res
        assert res["nnp"] == "1", res


def test_nested_user_namespace_is_refused(sandbox: Sandbox) -> None:
    require(sandbox, "privileges")
    res = json.loads(run_ok(sandbox, PRIVS))
    assert res.get("unshare_user", "EPERM") != "ok", res


def test_seccomp_blocks_ptrace_mount_bpf_keyctl_and_tiocsti(sandbox: Sandbox) -> None:
    require(sandbox, "privileges")
    res = json.loads(run_ok(sandbox, PRIVS))
    if "ctypes" in res:
        return  # no way to issue raw syscalls at all
    assert res["seccomp"] == "2", res
    for call in ("mount", "bpf", "keyctl"):
        assert res[call] != "ok", (call, res)
    # Without the filter these fail with ENOTTY (stdin is not a terminal); EPERM proves the filter.
    assert res["tiocsti"] == "EPERM" and res["tiocsti_masked"] == "EPERM", res
    # Without the filter PTRACE_TRACEME succeeds (a process may always ask to be traced).
    assert res["ptrace_traceme"] == "EPERM", res


def test_inet_sockets_are_refused_without_a_proxy(sandbox: Sandbox) -> None:
    require(sandbox, "network")
    out = run_ok(
        sandbox,
        """
import socket
for fam in ("AF_INET", "AF_INET6"):
    try:
        socket.socket(getattr(socket, fam), socket.SOCK_STREAM).bind(("127.0.0.1", 0) if fam == "AF_INET" else ("::1", 0))
        print(fam, "bound")
    except Exception as e:
        print(fam, type(e).__name__)
""",
    )
    assert "bound" not in out or sandbox.backend_name in ("docker",), out


CROSS = """
import json, os, socket, time
mine = {me!r}
open(f"{{mine}}.txt", "w").write(mine)  # in the scratch dir (cwd), wherever the backend puts it
bound = "no-unix"
if hasattr(socket, "AF_UNIX"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind("\\0arborl-shared-name")  # the same abstract name in both runs
        s.listen(1)
        bound = "bound"
    except OSError as e:
        bound = type(e).__name__
time.sleep(1.0)  # both runs are alive now
files = []
for d in {{os.getcwd(), "/tmp"}}:
    try:
        files += os.listdir(d)
    except OSError:
        pass
procs = []
try:
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            procs.append(open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
except OSError:
    pass
print(json.dumps({{"files": files, "bound": bound, "procs": "\\n".join(procs)}}))
"""


def test_concurrent_runs_see_neither_files_nor_processes_and_share_names(sandbox: Sandbox) -> None:
    require(sandbox, "cross_run")
    outs: dict[str, dict] = {}

    def one(me: str) -> None:
        outs[me] = json.loads(run_ok(sandbox, CROSS.format(me=me)))

    threads = [threading.Thread(target=one, args=(me,)) for me in ("run-alpha", "run-beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for me, other in (("run-alpha", "run-beta"), ("run-beta", "run-alpha")):
        res = outs[me]
        assert f"{me}.txt" in res["files"], res
        assert f"{other}.txt" not in res["files"], res
        assert other not in res["procs"], res
        assert res["bound"] in ("bound", "no-unix"), res


def test_nothing_persists_between_runs(sandbox: Sandbox) -> None:
    run_ok(
        sandbox,
        """
import os
open("left-behind.txt", "w").write("x")
for path in ("/tmp/left-behind.txt", "/dev/shm/left-behind"):
    try:
        open(path, "w").write("x")
    except OSError:
        pass
os.environ["LEFT_BEHIND"] = "1"
import json
json.left_behind = True
""",
    )
    out = run_ok(
        sandbox,
        """
import os, json
print(os.path.exists("left-behind.txt") or os.path.exists("/tmp/left-behind.txt"), os.path.exists("/dev/shm/left-behind"),
      "LEFT_BEHIND" in os.environ, hasattr(json, "left_behind"))
""",
    )
    assert out.split() == ["False", "False", "False", "False"], out
