"""BM25 retrieval throughput: through the HTTP endpoint against ``bm25s`` called in-process.

Generates the default corpus (10,060 passages, seed 0), indexes it with BM25, and answers the
generator's oracle queries (about 4,800, cycled) in batches of 64, top-3, three ways:

* ``bm25s in-process``: ``bm25s.tokenize`` + ``BM25.retrieve`` on the index, nothing else.
* ``BM25Retriever.search``: arborl's wrapper (adds the passages and scores per hit).
* ``HTTP /retrieve``: ``arborl serve-retriever`` in its own process on a loopback port, queried
  by ``SearchClient.search`` with ``return_scores`` (JSON both ways, one request per batch,
  one request at a time).

Prints queries/s for each and the HTTP overhead as a ratio of the in-process time, then the
share of oracle queries whose supporting passage came back in the top 3.

Usage: ``python bench/retriever.py [--batches 60] [--batch-size 64] [--topk 3]``
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from arborl.search.client import SearchClient
from arborl.search.corpus import write_dataset
from arborl.search.formats import read_corpus, read_qa
from arborl.search.retriever import BM25Retriever


def timed(fn: Callable[[list[str]], object], batches: list[list[str]]) -> tuple[float, list[object]]:
    fn(batches[0])  # warm-up
    t = time.perf_counter()
    out = [fn(b) for b in batches]
    return time.perf_counter() - t, out


def start_server(corpus: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "arborl.cli", "serve-retriever", str(corpus), "--port", str(port)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = proc.stdout.readline().rsplit(" ", 1)[-1].strip()
    client = SearchClient(url, retries=20, backoff=0.05)
    client("warm up")  # retried until uvicorn accepts
    return proc, url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--topk", type=int, default=3)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="arborl-bench-retriever-"))
    corpus_path, qa_path = write_dataset(tmp)
    passages, questions = read_corpus(corpus_path), read_qa(qa_path)
    pairs = [(q.oracle_queries[h], q.supporting_ids[h]) for q in questions for h in range(q.hops)]
    n = args.batches * args.batch_size
    pairs = [pairs[i % len(pairs)] for i in range(n)]
    batches = [[query for query, _ in pairs[i:i + args.batch_size]] for i in range(0, n, args.batch_size)]
    t = time.perf_counter()
    r = BM25Retriever(passages)
    print(f"corpus {len(passages):,} passages, indexed in {time.perf_counter() - t:.2f} s; "
          f"{n:,} queries in batches of {args.batch_size}, top-{args.topk}")

    import bm25s

    def raw(b: list[str]) -> object:
        return r.model.retrieve(bm25s.tokenize(b, stopwords="en", return_ids=False, show_progress=False),
                                k=args.topk, show_progress=False)

    rows = [("bm25s in-process", *timed(raw, batches)),
            ("BM25Retriever.search", *timed(lambda b: r.search(b, args.topk), batches))]
    proc, url = start_server(corpus_path)
    try:
        client = SearchClient(url, topk=args.topk)
        rows.append(("HTTP /retrieve (separate process)", *timed(client.search, batches)))
    finally:
        proc.terminate()
        proc.wait(20)

    base = rows[0][1]
    print(f"{'path':<36}{'seconds':>9}{'queries/s':>12}{'time / in-process':>20}")
    for name, secs, _ in rows:
        print(f"{name:<36}{secs:>9.3f}{n / secs:>12,.0f}{secs / base:>19.2f}x")
    hits = iter(row for batch in rows[-1][2] for row in batch)
    found = sum(pid in {h.passage.id for h in next(hits)} for _, pid in pairs)
    print(f"supporting passage in the top {args.topk} over HTTP: {found / n:.1%} of {n:,} oracle queries")


if __name__ == "__main__":
    main()
