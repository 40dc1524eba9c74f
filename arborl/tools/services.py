"""Services a tool recipe starts once per process: a retriever server, a database, a sandbox pool...

A tool env is built many times in a run (one per rollout slot, every rollout), but the backend its
tools talk to should start once. :func:`shared_service` starts a service the first time a key is
asked for and hands the same object to every later caller; every service is stopped when the
process ends (``atexit``: a normal end, an error, or Ctrl-C, which arborl's CLI turns into exit
code 130), or earlier with :func:`stop_services`::

    server = shared_service(("retriever", corpus_path), start=lambda: RetrieverServer(r).start(),
                            stop=lambda s: s.stop())

Thread-safe: envs are built on the rollout's worker threads, and a service is started once even
when several of them ask at the same time.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_services: dict[Hashable, tuple[Any, Callable[[Any], None]]] = {}


def shared_service(key: Hashable, *, start: Callable[[], T], stop: Callable[[T], None]) -> T:
    """The service under ``key``, started with ``start()`` on first use; ``stop(service)`` runs at exit.

    Args:
        key: What identifies the service (e.g. ``("retriever", corpus, method)``).
        start: Builds and starts the service (called at most once per key while it runs).
        stop: Stops it; errors of ``stop`` are ignored at exit.

    Returns:
        The running service.
    """
    with _lock:
        if key not in _services:
            _services[key] = (start(), stop)
        return _services[key][0]


def running_services() -> list[Hashable]:
    """Keys of the services started and not yet stopped."""
    with _lock:
        return list(_services)


def stop_services() -> None:
    """Stop every service, newest first (idempotent); the next :func:`shared_service` starts afresh."""
    with _lock:
        items = list(_services.items())[::-1]
        _services.clear()
    for _, (service, stop) in items:
        with contextlib.suppress(Exception):  # best effort: the process is ending or the run is over
            stop(service)


atexit.register(stop_services)
