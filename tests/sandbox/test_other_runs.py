"""Probes: one run cannot reach another run's processes, through the uid they would share.

The attacker is a run of the ``process`` backend: it shares the host's pid namespace, so it sees
every sandbox's processes in ``/proc`` and may signal any of them that runs as its own uid. Each
probe holds every backend (as the victim) to one property; none is waived by ``guarantees``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbutil import LIMITS, require_backend, run_ok

from arborl.sandbox import ExecResult, Sandbox
from arborl.sandbox.uids import UID_RANGE

# Replace the run's interpreter by one whose command line carries a marker the host can find.
EXEC_MARKED = """
import os, sys
if not hasattr(os, "execv"):
    print("no-exec")
else:
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1.5)", {marker!r}])
"""


def _host_uids_of(marker: str) -> list[int]:
    """Real uids of the host processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                status = (entry / "status").read_text()
                found.append(int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1]))
        except (OSError, StopIteration):
            continue
    return found


DUMPABLE = """
try:
    import ctypes
except ImportError:
    print("no-ctypes")
else:
    print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
"""

# Kill every process the run may signal, again and again for a while.
KILL_ALL = """
import os, time
end = time.monotonic() + {seconds}
hits = 0
while time.monotonic() < end:
    try:
        os.kill(-1, 9)
        hits += 1
    except OSError:
        pass
    time.sleep(0.02)
print(hits)
"""

# Write a forged json.py (and a marker module) into the scratch dir of every process it can
# reach through /proc: idle bwrap spares, ready zygote runners, warm containers, wasm workers.
PLANT = """
import os, time
forged = "def dumps(obj, *a, **k):\\n    return 'FORGED'\\n"
end = time.monotonic() + {seconds}
planted = set()
while time.monotonic() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for where in ("root/tmp", "cwd", "root/scratch"):
            for name, text in (("json.py", forged), ("planted.py", "")):
                try:
                    with open(f"/proc/{{pid}}/{{where}}/{{name}}", "w") as fh:
                        fh.write(text)
                    planted.add(pid)
                except OSError:
                    pass
    time.sleep(0.01)
print(len(planted))
"""
# Open whatever /proc offers of every other process: stdin, cwd, root, environment.
SNOOP = """
import os, time
end = time.monotonic() + {seconds}
opened, found = set(), False
while time.monotonic() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for what in ("fd/0", "environ", "cwd", "root"):
            path = f"/proc/{{pid}}/{{what}}"
            try:
                if what in ("cwd", "root"):
                    os.listdir(path)
                else:
                    with open(path, "rb") as fh:
                        found = found or {secret!r}.encode() in fh.read(1 << 16)
                opened.add(f"{{pid}}/{{what}}")
            except OSError:
                pass
    time.sleep(0.01)
print(found, sorted(opened)[:20])
"""
VICTIM_IMPORT = "import json, os\nnames = os.listdir('.')\nprint(json.dumps(1), 'json.py' in names, 'planted.py' in names)"


@pytest.fixture(scope="module")
def attacker() -> Iterator[Sandbox]:
    """A ``process``-backend sandbox: its runs share the host's pid namespace."""
    require_backend("process")
    sb = Sandbox("process", LIMITS)
    yield sb
    sb.close()


def _in_background(sb: Sandbox, code: str, stdin: str = "") -> tuple[threading.Thread, list[ExecResult]]:
    out: list[ExecResult] = []
    t = threading.Thread(target=lambda: out.append(sb.run_python(code, stdin=stdin)))
    t.start()
    return t, out


def test_concurrent_runs_have_distinct_reserved_host_uids(sandbox: Sandbox) -> None:
    markers = [f"arborl-uid-probe-{secrets.token_hex(6)}" for _ in range(2)]
    runs = [_in_background(sandbox, EXEC_MARKED.format(marker=m)) for m in markers]
    seen: dict[str, list[int]] = {m: [] for m in markers}
    end = time.monotonic() + 3.0
    while time.monotonic() < end and not all(seen.values()) and any(t.is_alive() for t, _ in runs):
        for m in markers:
            seen[m] = seen[m] or _host_uids_of(m)
        time.sleep(0.02)
    for t, _ in runs:
        t.join()
    if any(out[0].stdout.strip() == "no-exec" for _, out in runs):
        pytest.skip(f"{sandbox.backend_name}: the snippet cannot exec, so it has no host process of its own")
    assert all(out[0].exit_code == 0 for _, out in runs), [out[0] for _, out in runs]
    assert all(len(found) == 1 for found in seen.values()), seen  # one host process per marker
    (a,), (b,) = seen.values()
    assert a != b, seen
    assert a in UID_RANGE and b in UID_RANGE, (seen, UID_RANGE)


def test_the_snippets_interpreter_is_not_dumpable(sandbox: Sandbox) -> None:
    out = run_ok(sandbox, DUMPABLE).strip()
    if out == "no-ctypes":
        pytest.skip(f"{sandbox.backend_name}: no ctypes, no /proc and no ptrace to expose anything through")
    assert out == "0", out


def test_kill_all_from_a_host_pid_namespace_run_spares_other_runs(
    sandbox: Sandbox, attacker: Sandbox
) -> None:
    victim, out = _in_background(sandbox, "import time\ntime.sleep(2.5)\nprint('alive')")
    time.sleep(0.4)  # the victim's processes exist now
    attack = attacker.run_python(KILL_ALL.format(seconds=2.0))
    victim.join()
    assert attack.exit_code == 0, attack
    assert out[0].ok and out[0].stdout == "alive\n", out[0]


def test_module_planted_by_another_run_never_reaches_a_later_run(sandbox: Sandbox, attacker: Sandbox) -> None:
    run_ok(sandbox, "print(1)")  # warm: spares, runners and pool containers are up and idle
    attack, planted = _in_background(attacker, PLANT.format(seconds=2.5))
    outs = []
    for _ in range(4):
        time.sleep(0.4)  # the next sandbox sits idle while the attacker scans
        outs.append(run_ok(sandbox, VICTIM_IMPORT))
    attack.join()
    assert planted[0].exit_code == 0, planted[0]
    assert outs == ["1 False False\n"] * 4, (outs, planted[0].stdout)


def test_a_host_pid_namespace_run_opens_nothing_of_other_runs(sandbox: Sandbox, attacker: Sandbox) -> None:
    secret = "arborl-stdin-secret-" + secrets.token_hex(8)
    victim, out = _in_background(
        sandbox, "import sys, time\ntime.sleep(2.0)\nprint(len(sys.stdin.read()))", secret
    )
    time.sleep(0.3)  # the victim runs, its stdin unread
    snoop = attacker.run_python(SNOOP.format(seconds=1.5, secret=secret))
    victim.join()
    assert out[0].ok and out[0].stdout == f"{len(secret)}\n", out[0]
    assert snoop.exit_code == 0 and snoop.stdout == "False []\n", snoop
