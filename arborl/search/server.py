"""An HTTP retrieval service speaking Search-R1's protocol (FastAPI + uvicorn).

``POST /retrieve`` with ``{"queries": [str, ...], "topk": int, "return_scores": bool}`` answers
``{"result": [per_query, ...]}``: for each query a list of
``{"document": {"id": ..., "contents": "\\"Title\\"\\ntext"}, "score": float}`` when
``return_scores`` is true, and of bare ``{"id": ..., "contents": ...}`` documents otherwise,
best first. That is the body Search-R1's ``retrieval_server.py`` returns, so Search-R1's and
verl's search tools work against it unchanged. ``topk`` may be left out or ``null`` (the
server's default); a ``topk`` above the corpus size returns the whole corpus. Fields are
checked strictly: a missing ``queries``, a string ``topk`` or a non-string query gets a 422
whose ``detail`` names the field (FastAPI's ``loc``) and whose ``error`` says it in one line.
Unknown fields are ignored, as Search-R1's server ignores them. ``GET /health`` answers the
corpus size and method.

Run it with ``arborl serve-retriever CORPUS.jsonl``, or in-process::

    with RetrieverServer(BM25Retriever(passages)) as server:   # a free loopback port
        SearchClient(server.url)("Tislei Works CEO")
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from arborl.config import ConfigError
from arborl.search.retriever import Retriever


class RetrieveRequest(BaseModel):
    """The body of ``POST /retrieve`` (Search-R1's ``QueryRequest``, with strict types)."""

    queries: list[StrictStr]
    topk: StrictInt | None = Field(default=None, ge=1)
    return_scores: StrictBool = False


def create_app(retriever: Retriever, *, default_topk: int = 3, method: str = "bm25") -> Any:
    """The FastAPI application serving ``retriever`` at ``POST /retrieve``."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="arborl retriever", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        line = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
        return JSONResponse(status_code=422, content={"detail": detail, "error": line})

    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> Response:
        hits = retriever.search(req.queries, req.topk or default_topk)
        if req.return_scores:
            result: list[list[Any]] = [[{"document": h.passage.to_json(), "score": h.score} for h in row] for row in hits]
        else:
            result = [[h.passage.to_json() for h in row] for row in hits]
        # serialised here: FastAPI's generic encoder walks every dict and costs more than the search
        return Response(json.dumps({"result": result}, ensure_ascii=False), media_type="application/json")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "passages": len(retriever.passages), "method": method}

    return app


def bind(host: str = "127.0.0.1", port: int = 0, who: str = "retriever") -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free port, read back from the socket).

    Raises:
        ConfigError: When the address cannot be bound (in use, not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"{who}: cannot listen on {host}:{port} ({e.strerror}); "
                          "choose another --port (0 picks a free one) or --host") from None
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    """The ``/retrieve`` URL of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/retrieve" if ":" in host else f"http://{host}:{port}/retrieve"


def make_server(app: Any) -> Any:
    """A quiet uvicorn server for ``app`` (one process; access log off)."""
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))


class RetrieverServer:
    """The retrieval service on a loopback port in a background thread; a context manager.

    Leaving the ``with`` block, by normal exit, exception or Ctrl-C, stops the server and closes
    its socket: uvicorn is asked to exit, given ``shutdown_timeout`` seconds to finish open
    requests, then forced.

    Args:
        retriever: What to serve.
        host: Address to bind (loopback by default).
        port: Port to bind; 0 picks a free one.
        default_topk: ``topk`` for requests that leave it out.
        start_timeout: Seconds to wait for the server to accept connections.
        shutdown_timeout: Seconds to wait for it to stop before forcing it.

    Attributes:
        url: ``http://HOST:PORT/retrieve``, set once started.
    """

    def __init__(self, retriever: Retriever, *, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3,
                 method: str = "bm25", start_timeout: float = 30.0, shutdown_timeout: float = 5.0) -> None:
        self.retriever, self.host, self.port = retriever, host, port
        self.default_topk, self.method = default_topk, method
        self.start_timeout, self.shutdown_timeout = start_timeout, shutdown_timeout
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    def start(self) -> RetrieverServer:
        """Bind, start serving in a daemon thread, and wait until it accepts requests."""
        self._sock = bind(self.host, self.port)
        self.url = url_of(self._sock)
        self._server = make_server(create_app(self.retriever, default_topk=self.default_topk, method=self.method))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="arborl-retriever", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"retriever server on {self.url} did not start within {self.start_timeout} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(self.shutdown_timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(self.shutdown_timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def __enter__(self) -> RetrieverServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
