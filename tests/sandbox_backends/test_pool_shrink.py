"""Pooled backends shrink back to their idle size after a burst of concurrent runs.

A run that finds no idle worker starts one, so ``BURST`` concurrent runs grow a pool of one to
``BURST`` workers. Once the burst is over, the workers beyond ``idle_size`` (1 here) must be
stopped within ``shrink_after_s`` plus a little, not kept until ``close()``; the one kept still
serves runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from backendkit import docker_cli

from arborl.sandbox.base import Limits
from arborl.sandbox.docker import DockerBackend
from arborl.sandbox.pool import IdlePool
from arborl.sandbox.wasm import WasmBackend

LIMITS = Limits(wall_s=8.0, cpu_s=6.0, memory_mb=64, pids=32, disk_mb=4, output_bytes=4096)
BURST = 3
SHRINK_S = 1.0
# Outlasts the pools' wait for an idle worker (wasm 1 s, docker 2 s), so every run of the burst
# ends up on a worker of its own.
HOLD = "import time\ntime.sleep(3)\nprint('done')"


def _burst(run: Callable[[str], object], count: Callable[[], int]) -> None:
    """Run ``BURST`` runs at once; the pool must hold ``BURST`` workers while they run."""
    with ThreadPoolExecutor(BURST) as ex:
        futures = [ex.submit(run, HOLD) for _ in range(BURST)]
        assert _settles(count, BURST, 15.0)  # watched during the burst: shrinking may start early
        assert [f.result().stdout for f in futures] == ["done\n"] * BURST  # type: ignore[attr-defined]


def _settles(count: Callable[[], int], want: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while count() != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return count() == want


def test_wasm_pool_shrinks_back_to_its_idle_size(wasm_ready: str) -> None:
    with WasmBackend(LIMITS, pool_size=1, shrink_after_s=SHRINK_S) as b:
        seen: set[object] = set()

        def count() -> int:
            with b._lock:
                seen.update(b._workers)
                return len(b._workers)

        _burst(b.run_python, count)
        assert _settles(count, 1, SHRINK_S + 3.0)
        assert sum(w.proc.poll() is None for w in seen) == 1  # the others' processes are gone
        assert b.run_python("print(7)").stdout == "7\n"


def test_docker_pool_shrinks_back_to_its_idle_size(docker_host: str) -> None:
    with DockerBackend(LIMITS, docker_host=docker_host, pool_size=1, shrink_after_s=SHRINK_S) as b:

        def owned() -> int:
            return len(docker_cli(docker_host, "ps", "-q", "--filter", f"label=arborl.sandbox.owner={b._owner}")
                       .stdout.split())

        _burst(b.run_python, owned)
        assert _settles(owned, 1, SHRINK_S + 10.0)  # docker kill + rm take a while on a busy host
        assert b.run_python("print(7)").stdout == "7\n"


def test_idle_size_zero_stops_every_idle_worker_and_bad_values_name_the_field() -> None:
    stopped: list[int] = []
    pool: IdlePool[int] = IdlePool(stopped.append, idle_size=0, shrink_after_s=0.2)
    pool.put(1)
    pool.put(2)
    assert pool.get(timeout=0) == 2  # most recently returned first
    assert _settles(lambda: len(pool), 0, 2.0) and stopped == [1]
    assert pool.close() == [] and pool.get(timeout=0) is None
    pool.put(3)  # returned after close: stopped at once
    assert stopped == [1, 3]
    with pytest.raises(ValueError, match="idle_size must be >= 0"):
        IdlePool(stopped.append, idle_size=-1, shrink_after_s=1.0)
    with pytest.raises(ValueError, match="shrink_after_s must be > 0"):
        IdlePool(stopped.append, idle_size=1, shrink_after_s=0)
