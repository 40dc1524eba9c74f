"""``arborl serve-retriever CORPUS.jsonl [--port N] [--host H] [--method bm25|dense] [--topk K]``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any


def add_search_commands(sub: Any) -> None:
    """Add ``serve-retriever`` to the ``arborl`` subcommands (imports nothing heavy)."""
    p = sub.add_parser("serve-retriever", help="serve a corpus over HTTP with Search-R1's POST /retrieve protocol")
    p.add_argument("corpus", help='corpus JSONL, one {"id": ..., "contents": "\\"Title\\"\\ntext"} a line')
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)")
    p.add_argument("--method", choices=["bm25", "dense"], default="bm25",
                   help="bm25 (bm25s, default) or dense (MiniLM embeddings, needs arborl[dense])")
    p.add_argument("--topk", type=int, default=3, help="passages per query when a request leaves topk out")
    p.add_argument("--cache-dir", metavar="DIR", help="keep dense embeddings here between starts (method dense)")
    p.set_defaults(func=serve_retriever)


def serve_retriever(args: argparse.Namespace) -> int:
    """Index the corpus and serve it until SIGTERM (exit 0) or Ctrl-C (exit 130); prints the URL once it listens."""
    from arborl.search.formats import read_corpus
    from arborl.search.retriever import build_retriever
    from arborl.search.server import RetrieverServer

    passages = read_corpus(args.corpus)
    retriever = build_retriever(passages, args.method, cache_dir=args.cache_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # uvicorn runs in a thread of the server object, so its shutdown on SIGTERM, Ctrl-C or an error
    # is the one the in-process server has; this thread only waits
    with RetrieverServer(retriever, host=args.host, port=args.port, default_topk=args.topk, method=args.method) as server:
        print(f"arborl: serving {len(passages)} passages ({args.method}) at {server.url}", flush=True)
        while not stop.wait(0.5):
            pass
    print("arborl: retriever stopped", file=sys.stderr)
    return 0
