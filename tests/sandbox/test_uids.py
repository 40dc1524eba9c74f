"""The sandbox uid leases: exclusive across processes, reaped after a dead owner, range checked."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from arborl.sandbox import uids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="leases of other uids' processes need root")

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(30)
"""


def _point_cursor_at(uid: int) -> None:
    uids._cursor[0] = uid - uids.UID_RANGE.start


def test_a_uid_held_by_another_process_is_skipped() -> None:
    probe = uids.lease()
    uid = probe.uid
    probe.release()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, uids._path(uid)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        _point_cursor_at(uid)
        lease = uids.lease()
        assert lease.uid != uid
        lease.release()
    finally:
        holder.kill()
        holder.wait()
        os.unlink(uids._path(uid))


def test_leases_in_one_process_are_distinct_and_release_removes_the_file() -> None:
    leases = [uids.lease() for _ in range(20)]
    assert len({lease.uid for lease in leases}) == 20
    assert all(lease.uid in uids.UID_RANGE for lease in leases)
    for lease in leases:
        assert os.path.exists(uids._path(lease.uid))
        lease.release()
        lease.release()  # idempotent
        assert not os.path.exists(uids._path(lease.uid))


def test_a_uid_left_by_a_dead_owner_is_reaped_before_reuse() -> None:
    probe = uids.lease()
    uid = probe.uid
    probe.release()
    # What a crashed owner leaves: the lock file (never unlinked) and a process still running as the uid.
    os.close(os.open(uids._path(uid), os.O_CREAT | os.O_WRONLY, 0o600))
    survivor = subprocess.Popen(["sleep", "30"], user=uid, group=uid, extra_groups=[])
    try:
        time.sleep(0.05)
        assert survivor.poll() is None
        _point_cursor_at(uid)
        lease = uids.lease()
        assert lease.uid == uid
        assert survivor.wait(timeout=5) == -9  # killed before the uid was handed out again
        lease.release()
    finally:
        if survivor.poll() is None:
            survivor.kill()
            survivor.wait()


@pytest.mark.parametrize("spec", ["100:1000", "1900000000", "x:y", "2000000000:8"])
def test_a_bad_uid_range_is_refused_with_the_rule(spec: str) -> None:
    env = {**os.environ, "ARBORL_SANDBOX_UIDS": spec}
    r = subprocess.run(
        [sys.executable, "-c", "import arborl.sandbox.uids"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1
    assert f"ARBORL_SANDBOX_UIDS={spec!r} must be FIRST:COUNT" in r.stderr.strip().splitlines()[-1]


def test_a_good_uid_range_is_used() -> None:
    env = {**os.environ, "ARBORL_SANDBOX_UIDS": "2000000000:64"}
    r = subprocess.run(
        [sys.executable, "-c", "from arborl.sandbox import uids; l = uids.lease(); print(l.uid); l.release()"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert 2_000_000_000 <= int(r.stdout) < 2_000_000_064


def test_host_uses_of_the_range_are_listed(tmp_path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0::/root:/bin/sh\nclash:x:5010:5010::/:/bin/sh\nok:x:4999:4999::/:/bin/sh\n")
    subuid = tmp_path / "subuid"
    # alice ends below the range, carol too; bob overlaps its end (5063-5072)
    subuid.write_text("alice:4000:1000\nbob:5063:10\ncarol:3000:1000\n")
    found = uids.conflicts(range(5000, 5064), passwd=str(passwd), subid_files=(str(subuid),))
    assert found == [f"{passwd}: user clash has uid 5010", f"{subuid}: bob maps 5063-5072"]
