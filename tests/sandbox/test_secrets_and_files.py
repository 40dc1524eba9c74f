"""Probes: environment secrets and host files must not be reachable from a snippet."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbutil import CANARY, require, run_ok

from arborl.sandbox import Sandbox

PROJECT = Path(__file__).resolve().parents[2]


def test_env_secret_canary_is_not_in_environ_or_any_proc_environ(sandbox: Sandbox) -> None:
    require(sandbox, "env")
    assert os.environ["ARBORL_TEST_SECRET"] == CANARY  # the parent does hold it
    out = run_ok(
        sandbox,
        """
import os
found = [k for k, v in os.environ.items() if "arborl-canary" in v]
try:
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
except OSError:
    pids = []  # no /proc at all (wasm): nothing to leak through it
for pid in pids:
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                if b"arborl-canary" in f.read():
                    found.append(f"{pid}/{name}")
        except OSError:
            pass
print("FOUND" if found else "CLEAN", found)
""",
    )
    assert out.startswith("CLEAN") and CANARY not in out


def test_proc_1_environ_holds_no_secret(sandbox: Sandbox) -> None:
    require(sandbox, "env")
    out = run_ok(
        sandbox,
        """
try:
    data = open("/proc/1/environ", "rb").read()
except OSError as e:
    data = b""
print("LEAK" if b"arborl-canary" in data or b"ARBORL_TEST_SECRET" in data else "CLEAN")
""",
    )
    assert out.strip() == "CLEAN"


def test_host_secret_files_unreadable(sandbox: Sandbox) -> None:
    require(sandbox, "host_files")
    out = run_ok(
        sandbox,
        """
import json, os
res = {}
for path in ("/etc/shadow", "/root/.bashrc", "/root/.ssh/id_rsa", "/var/run/docker.sock"):
    try:
        open(path, "rb").read(16)
        res[path] = "read"
    except OSError as e:
        res[path] = type(e).__name__
for d in ("/root", "/home", "/work"):
    try:
        res[d] = "listed:%d" % len(os.listdir(d))
    except OSError as e:
        res[d] = type(e).__name__
print(json.dumps(res))
""",
    )
    res = json.loads(out)
    assert not any(v == "read" or (v.startswith("listed") and v != "listed:0") for v in res.values()), res


def test_project_tree_not_visible(sandbox: Sandbox) -> None:
    require(sandbox, "host_files")
    probe = PROJECT / "pyproject.toml"
    assert probe.exists()
    out = run_ok(
        sandbox, f"import os; print(os.path.exists({str(probe)!r}), os.path.exists({str(PROJECT)!r}))"
    )
    assert out.split() == ["False", "False"]


@pytest.fixture
def host_canary() -> Iterator[Path]:
    """A world-writable host dir with a world-writable canary file (what a snippet must not touch)."""
    base = "/run" if os.access("/run", os.W_OK) else None
    d = Path(tempfile.mkdtemp(prefix="arborl-canary-", dir=base))
    d.chmod(0o777)
    f = d / "canary.txt"
    f.write_text("original")
    f.chmod(0o666)
    yield f
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def test_writes_outside_scratch_fail_and_host_canary_unchanged(sandbox: Sandbox, host_canary: Path) -> None:
    require(sandbox, "host_files")
    before = sorted(p.name for p in host_canary.parent.iterdir())
    out = run_ok(
        sandbox,
        f"""
import json
res = {{}}
for path in ({str(host_canary)!r}, {str(host_canary.parent / "new.txt")!r}, "/usr/lib/arborl-evil",
             "/etc/arborl-evil", "/arborl-evil", "/dev/arborl-evil", "/bin/python3"):
    try:
        with open(path, "a") as f:
            f.write("pwned")
        res[path] = "written"
    except OSError as e:
        res[path] = type(e).__name__
open("scratch-ok.txt", "w").write("fine")  # the scratch dir itself is writable
print(json.dumps(res))
""",
    )
    res = json.loads(out)
    assert "written" not in res.values(), res
    assert host_canary.read_text() == "original"
    assert sorted(p.name for p in host_canary.parent.iterdir()) == before
    assert not Path("/usr/lib/arborl-evil").exists() and not Path("/etc/arborl-evil").exists()
