"""An expiring process for the concurrency tests: ``python expire_proc.py URL N``.

Deletes episodes 0..N-1 of :func:`storekit.make_episode` (created at 1_700_000_000 + i) one at a
time, oldest first, each with its own ``expire`` call, then prints "done". After the first half
it waits for a line on stdin, so a reader is sure to read a half-expired store between them.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from arborl.store import open_store  # noqa: E402


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2])
    with open_store(url) as store:
        print("ready", flush=True)
        for i in range(n):
            if i == n // 2:
                sys.stdin.readline()
            # created_at < now - 1 s removes episodes 0..i
            store.expire(older_than=timedelta(seconds=1), now=1_700_000_000.0 + i + 1 + 0.5)
        print("done", flush=True)


if __name__ == "__main__":
    main()
