"""The Sandbox facade: backend table, errors that name the fix, files/stdin, asyncio, limits."""

from __future__ import annotations

import asyncio
import os

import pytest
from sbutil import LIMITS, require_backend, run_ok

import arborl.sandbox.bwrap as bwrap_mod
from arborl.sandbox import BACKENDS, Limits, Sandbox, SandboxError
from arborl.sandbox.core import probe_backend


def test_backend_table_names() -> None:
    assert list(BACKENDS) == ["bwrap", "process", "zygote", "docker", "wasm"]
    assert BACKENDS["docker"] == "arborl.sandbox.docker:DockerBackend"
    assert BACKENDS["wasm"] == "arborl.sandbox.wasm:WasmBackend"


def test_unknown_backend_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"unknown sandbox backend 'firecracker'.*'bwrap'.*'zygote'"):
        Sandbox("firecracker")


def test_available_backends_are_exactly_those_whose_probe_passes() -> None:
    avail = Sandbox.available_backends()
    assert set(avail) <= set(BACKENDS)
    assert all(probe_backend(n) is None for n in avail)
    assert all(probe_backend(n) is not None for n in set(BACKENDS) - set(avail))


def test_missing_bwrap_names_the_apt_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bwrap_mod, "BWRAP", "/nonexistent/bwrap")
    with pytest.raises(SandboxError, match="apt-get install -y bubblewrap"):
        Sandbox("bwrap", LIMITS)


def test_limits_reject_non_positive_values() -> None:
    with pytest.raises(ValueError, match="Limits.pids must be > 0"):
        Limits(pids=0)


def test_files_stdin_and_exit_code(backend_name: str) -> None:
    with Sandbox(backend_name, LIMITS) as sb:
        code = """
import sys
data = open("data/in.bin", "rb").read()
print(len(data), data[:2].hex(), open("note.txt").read(), sys.stdin.read().upper())
sys.exit(7)
"""
        res = sb.run_python(code, stdin="hello", files={"data/in.bin": bytes([0, 255, 1]), "note.txt": b"n"})
    assert res.stdout == "3 00ff n HELLO\n"
    assert (res.exit_code, res.ok, res.timed_out, res.backend) == (7, False, False, backend_name)


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/passwd", "a/../../b", "main.py"])
def test_bad_file_names_are_refused(name: str) -> None:
    require_backend("bwrap")
    with Sandbox("bwrap", LIMITS) as sb, pytest.raises(ValueError, match="must be a relative path"):
        sb.run_python("pass", files={name: b"x"})


def test_closed_sandbox_refuses_runs() -> None:
    require_backend("bwrap")
    sb = Sandbox("bwrap", LIMITS)
    sb.close()
    sb.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        sb.run_python("pass")


@pytest.mark.parametrize("name", ["bwrap", "zygote"])
def test_asyncio_tasks_run_concurrently_and_independently(name: str) -> None:
    require_backend(name)

    async def main(sb: Sandbox) -> list[str]:
        runs = [sb.arun_python(f"import time\ntime.sleep(0.5)\nprint({i} * {i})") for i in range(4)]
        return [r.stdout.strip() for r in await asyncio.gather(*runs)]

    with Sandbox(name, LIMITS) as sb:
        run_ok(sb, "pass")
        loop_start = asyncio.run(_timed(main(sb)))
    outs, elapsed = loop_start
    assert outs == ["0", "1", "4", "9"]
    assert elapsed < 4 * 0.5, f"4 runs of 0.5 s took {elapsed:.2f} s: they did not overlap"


async def _timed(coro: object) -> tuple[list[str], float]:
    loop = asyncio.get_running_loop()
    t = loop.time()
    out = await coro  # type: ignore[misc]
    return out, loop.time() - t


def test_no_cgroup_is_left_behind(backend_name: str) -> None:
    if backend_name not in ("bwrap", "process", "zygote"):
        pytest.skip("docker and wasm do not use arborl's cgroups")
    from pathlib import Path

    from arborl.sandbox import cgroup

    factory = cgroup.detect()
    if factory is None:
        pytest.skip("no usable cgroup hierarchy on this machine (rlimit fallback)")

    def mine() -> list[str]:
        return sorted(p.name for b in factory.bases for p in Path(b).glob(f"run-{os.getpid()}-*"))

    before = mine()
    with Sandbox(backend_name, LIMITS) as sb:
        sb.run_python("import time\ntime.sleep(10)")  # killed at the deadline
        sb.run_python("print(1)")
    assert mine() == before


def test_site_builtins_exist_and_system_packages_are_on_the_path(sandbox: Sandbox) -> None:
    res = sandbox.run_python(
        "import sys\nprint(callable(exit), callable(quit), callable(help))\n"
        "print(any(p.endswith('dist-packages') for p in sys.path))\nexit(3)"
    )
    assert (res.stdout.splitlines()[:1], res.exit_code) == (["True True True"], 3), res
    if sandbox.backend_name in ("bwrap", "zygote", "process"):  # Debian's python3 with its packages
        assert res.stdout.splitlines()[1] == "True", res
