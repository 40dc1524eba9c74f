"""Reading while another process expires (issue 10, item 9): every backend reads an episode from
one snapshot, so a query, get_many or iteration returns whole episodes only (equal to what was
written), skips the ones that vanished and never raises, while a real `expire` runs in another
process, one episode per call."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

from storekit import make_episode

from arborl.store import EpisodeNotFound, open_store

EXPIRER = str(Path(__file__).parent / "expire_proc.py")


def test_readers_see_whole_episodes_or_none_while_another_process_expires(store_url):
    n = 40 if "s3://" in store_url else 240  # the S3 emulator serves one request at a time
    want = {e.episode_id: e for e in (make_episode(i, n_turns=8) for i in range(n))}
    with open_store(store_url) as store:
        store.put_many(list(want.values()))
        proc = subprocess.Popen([sys.executable, EXPIRER, store_url, str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        passes, seen = 0, 0
        while proc.poll() is None or passes < 2:
            if passes == 1:  # the expirer stops halfway until a first pass is done
                proc.stdin.write("go on\n")
                proc.stdin.flush()
            got = list(store.iter_episodes(batch_size=7))
            got += store.query(limit=50).episodes
            ids = [f"ep{i:06d}" for i in range(0, n, 3)]
            with contextlib.suppress(EpisodeNotFound):  # an id that is gone is reported; none may come back partial
                got += store.get_many(ids)
            for ep in got:
                assert ep == want[ep.episode_id], f"{ep.episode_id} came back with {len(ep.turns)} of 8 turns"
            passes, seen = passes + 1, seen + len(got)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert store.count() == 0 and list(store.iter_episodes()) == []
    assert passes >= 2 and seen > 0, (passes, seen)  # reads before, at and after the halfway point
