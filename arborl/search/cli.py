"""``arborl serve-retriever CORPUS.jsonl [--port N] [--host H] [--method bm25|dense] [--topk K]``."""

from __future__ import annotations

import argparse
import sys
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
    p.set_defaults(func=serve_retriever)


def serve_retriever(args: argparse.Namespace) -> int:
    """Index the corpus and serve it until Ctrl-C or SIGTERM; prints the URL once it listens."""
    from arborl.search.formats import read_corpus
    from arborl.search.retriever import build_retriever
    from arborl.search.server import bind, create_app, make_server, url_of

    passages = read_corpus(args.corpus)
    retriever = build_retriever(passages, args.method)
    sock = bind(args.host, args.port)
    server = make_server(create_app(retriever, default_topk=args.topk, method=args.method))
    print(f"arborl: serving {len(passages)} passages ({args.method}) at {url_of(sock)}", flush=True)
    try:
        server.run(sockets=[sock])  # uvicorn handles SIGINT/SIGTERM: finish open requests, then return
    finally:
        sock.close()
    print("arborl: retriever stopped", file=sys.stderr)
    return 0
