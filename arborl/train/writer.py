"""Write each RL iteration's episodes to the trajectory store off the critical path.

The trainer trains on the episodes it has just rolled out, in memory, and hands them to a
:class:`BackgroundWriter`, whose one thread calls ``store.put_many`` while the next phases run.
``tests/train/test_writer.py`` checks that the trained batch equals the one a read-back of the
stored episodes gives, so skipping the read changes nothing.

The queue is bounded (``max_pending`` batches): a store slower than the trainer makes
:meth:`BackgroundWriter.put` wait instead of piling up episodes in memory. A write that failed is
raised by the next :meth:`~BackgroundWriter.put` or :meth:`~BackgroundWriter.flush` (at the latest
when the run ends), so a broken store stops the run one iteration later instead of at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

from arborl.trajectory import Episode

_STOP = object()


class BackgroundWriter:
    """``store.put_many`` of each batch on a background thread, in submission order.

    Args:
        store: A trajectory store; only this writer's thread uses it until :meth:`flush` returns.
        max_pending: Batches that may wait in the queue before :meth:`put` blocks (>= 1).

    Use as a context manager: leaving the block flushes (raising a pending error) and stops the
    thread; leaving it on an exception still stops the thread without masking that exception.
    """

    def __init__(self, store: Any, *, max_pending: int = 2) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending is {max_pending}; use at least 1")
        self.store = store
        self.written = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="arborl-store-writer", daemon=True)
        self._thread.start()

    def put(self, episodes: Sequence[Episode]) -> None:
        """Queue ``episodes`` for writing (blocks while ``max_pending`` batches wait); raises an earlier failure."""
        self._raise()
        if not self._thread.is_alive():
            raise RuntimeError("the store writer is closed; open a new BackgroundWriter")
        self._queue.put(list(episodes))

    def flush(self) -> None:
        """Wait until every queued batch is written; raise the first write error, if any."""
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Stop the thread after the queued batches (errors are kept for :meth:`flush`)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is _STOP:
                    return
                if self._error is None:  # after a failure, later batches are dropped, not half-written
                    self.store.put_many(batch)
                    self.written += len(batch)
            except BaseException as exc:  # surfaced by the next put() / flush()
                self._error = exc
            finally:
                self._queue.task_done()


def store_episodes(sink: Any, episodes: list[Episode]) -> list[Episode]:
    """The episodes to train on after storing ``episodes`` in ``sink``.

    A :class:`BackgroundWriter` queues them and they are trained on as they are; a plain store is
    written and read back (``get_many(put_many(...))``), the synchronous path.
    """
    if isinstance(sink, BackgroundWriter):
        sink.put(episodes)
        return episodes
    return sink.get_many(sink.put_many(episodes))


def flush(sink: Any) -> None:
    """Wait for a :class:`BackgroundWriter`'s queued writes (and raise their error); a plain store has none."""
    if isinstance(sink, BackgroundWriter):
        sink.flush()


class _FlushingReader:
    """The store behind a :class:`BackgroundWriter`; the queued writes land before the first read."""

    def __init__(self, writer: BackgroundWriter) -> None:
        self._writer, self._flushed = writer, False

    def __getattr__(self, name: str) -> Any:
        if not self._flushed:
            self._writer.flush()
            self._flushed = True
        return getattr(self._writer.store, name)


def readable(sink: Any) -> Any:
    """The store behind ``sink``, for code that reads it back.

    A read waits for the queued writes, and only a read does: a reader that never reads costs nothing.
    """
    return _FlushingReader(sink) if isinstance(sink, BackgroundWriter) else sink
