"""The bwrap backend's spare sandboxes: started before their request, each used for one run."""

from __future__ import annotations

import os
import signal

import pytest
from sbutil import LIMITS, require_backend

from arborl.sandbox.bwrap import BwrapBackend


@pytest.fixture
def make_backend():
    require_backend("bwrap")
    made: list[BwrapBackend] = []

    def make(spares: int) -> BwrapBackend:
        made.append(BwrapBackend(LIMITS, spares=spares))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def _spare_pids(backend: BwrapBackend) -> list[int]:
    return [fut.result().proc.pid for fut in list(backend._spares)]


@pytest.mark.parametrize("spares", [0, 1, 3])
def test_every_run_gets_a_sandbox_of_its_own(make_backend, spares: int) -> None:
    backend = make_backend(spares)
    for i in range(spares + 3):
        res = backend.run_python(
            "import os\nprint(sorted(os.listdir('.')), os.getpid())\nopen('left', 'w').write('x')",
            files={f"in{i}.txt": b"x"},
        )
        assert res.ok, res
        listing, pid = res.stdout.rsplit(" ", 1)
        assert listing == f"['in{i}.txt', 'main.py']"  # nothing left by the previous runs
        assert pid.strip() == "2"  # a fresh pid namespace (bwrap's init is pid 1)
    assert len(_spare_pids(backend)) == spares


def test_a_spare_killed_before_its_run_is_replaced(make_backend) -> None:
    backend = make_backend(1)
    spare = backend._spares[0].result()
    os.killpg(spare.proc.pid, signal.SIGKILL)
    spare.proc.wait(timeout=5)
    res = backend.run_python("print(6 * 7)")
    assert res.ok and res.stdout == "42\n", res


def test_close_stops_the_spares_and_removes_their_cgroups(make_backend) -> None:
    backend = make_backend(2)
    spares = [fut.result() for fut in list(backend._spares)]
    backend.close()
    for spare in spares:
        assert spare.proc.returncode is not None
        for d in spare.cg.dirs if spare.cg else []:
            assert not os.path.exists(d), f"cgroup {d} left behind"


def test_spares_must_be_a_count() -> None:
    require_backend("bwrap")
    with pytest.raises(ValueError, match="spares"):
        BwrapBackend(LIMITS, spares=-1)
