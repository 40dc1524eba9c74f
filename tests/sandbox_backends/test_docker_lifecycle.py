"""Docker: a warm container that fails its cleanliness check is replaced, never reused.

The runner removes every IPC object of the sandbox user itself; to make a container it cannot
clean, the tests plant a SysV segment as root through ``docker exec -u 0`` (still without
capabilities: the runner, uid 65534, may neither remove nor hide it). Found before a run, the run
moves to another container; left after a run, the container is replaced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from backendkit import docker_cli

from arborl.sandbox.base import Limits
from arborl.sandbox.docker import DockerBackend

LIMITS = Limits(wall_s=6.0, cpu_s=4.0, memory_mb=128, pids=32, disk_mb=8, output_bytes=4096)
CONTAINER_ID = "print(open('/proc/self/cgroup').read().split('/docker/')[1].split()[0][:12])"
PLANT_AS_ROOT = "import ctypes; print(ctypes.CDLL(None).shmget(0x4C494645, 4096, 0o1600))"


@pytest.fixture
def backend(docker_host: str) -> Iterator[DockerBackend]:
    b = DockerBackend(LIMITS, docker_host=docker_host, pool_size=1)
    yield b
    b.close()


def _idle_container(b: DockerBackend) -> str:
    name = b._idle.get(timeout=5.0)
    assert name is not None
    b._idle.put(name)
    return name


def _id(host: str, name: str) -> str:
    return docker_cli(host, "inspect", "-f", "{{.Id}}", name).stdout.strip()[:12]


def _plant(host: str, name: str) -> None:
    r = docker_cli(host, "exec", "-u", "0", name, "/usr/bin/python3", "-I", "-S", "-c", PLANT_AS_ROOT)
    assert r.returncode == 0 and int(r.stdout) >= 0, r


def _gone(host: str, name: str, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not docker_cli(host, "ps", "-q", "--filter", f"name={name}").stdout.strip():
            return True
        time.sleep(0.2)
    return False


def test_a_container_found_dirty_before_a_run_is_replaced_and_the_run_retried(
    docker_host: str, backend: DockerBackend
) -> None:
    victim = _idle_container(backend)
    victim_id = _id(docker_host, victim)
    _plant(docker_host, victim)
    r = backend.run_python(CONTAINER_ID)
    assert (r.ok, r.error) == (True, None), r
    assert len(victim_id) == 12 and r.stdout.strip() != victim_id  # ran elsewhere
    assert _gone(docker_host, victim)


def test_a_container_left_dirty_after_a_run_is_replaced(docker_host: str, backend: DockerBackend) -> None:
    victim = _idle_container(backend)
    assert backend.run_python(CONTAINER_ID).stdout.strip() == _id(docker_host, victim)  # the pool's one
    run = threading.Thread(target=backend.run_python, args=("import time\ntime.sleep(2)",))
    run.start()
    time.sleep(0.8)
    _plant(docker_host, victim)  # during the run: the runner's final check finds it
    run.join()
    assert _gone(docker_host, victim)
    assert backend.run_python(CONTAINER_ID).stdout.strip() != _id(docker_host, victim)
