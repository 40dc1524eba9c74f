"""A writer process for crash and concurrency tests.

Usage: python writer_proc.py URL START COUNT BATCH [DUP_EVERY]
Writes episodes START..START+COUNT-1 in batches and prints "ok <first> <last>" after each
put_many returns. With DUP_EVERY, each batch also carries episode (i // DUP_EVERY) * DUP_EVERY
content under a fresh id, so concurrent writers overlap on content.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from storekit import make_episode  # noqa: E402

from arborl.store import open_store  # noqa: E402


def main() -> None:
    url, start, count, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dup_every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    with open_store(url) as store:
        for lo in range(start, start + count, batch):
            hi = min(lo + batch, start + count)
            eps = [make_episode(i, n_turns=8) for i in range(lo, hi)]
            if dup_every:
                twin = make_episode((lo // dup_every) * dup_every, n_turns=8)
                twin.episode_id = f"twin-{start}-{lo}"
                eps.append(twin)
            store.put_many(eps)
            print(f"ok {lo} {hi - 1}", flush=True)


if __name__ == "__main__":
    main()
