"""Write each RL iteration's episodes to the trajectory store off the critical path.

The trainer trains on the episodes it has just rolled out, in memory, and hands them to a
:class:`BackgroundWriter`, whose one thread calls ``store.put_many`` while the next phases run.
``tests/train/test_writer.py`` checks that the trained batch equals the one a read-back of the
stored episodes gives, so skipping the read changes nothing.

The queue is bounded (``max_pending`` batches): a store slower than the trainer makes
:meth:`BackgroundWriter.put` wait instead of piling up episodes in memory. A write that failed is
raised by the next :meth:`~BackgroundWriter.put` or :meth:`~BackgroundWriter.flush` (at the latest
when the run ends), so a broken store stops the run one iteration later instead of at once.

The store keeps one copy of identical episodes (same content hash): a group's two identical
rollouts are stored under the first one's id, so the second one's id, which the trainer holds in
memory, names nothing in the store. The writer records each such id with the id it was stored
under, and :func:`readable` reads by either (the synchronous path trains on the read-back
episodes, whose ids are the stored ones already).
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
        self.aliases: dict[str, str] = {}
        """Submitted episode id -> the stored id, for an episode the store kept one copy of (a duplicate)."""
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
                    ids = self.store.put_many(batch)
                    self.aliases.update((e.episode_id, sid) for e, sid in zip(batch, ids, strict=True)
                                        if e.episode_id != sid)
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
    """The store behind a :class:`BackgroundWriter`; the queued writes land before the first read.

    A read by episode id also takes the id of a duplicate the store did not keep (the stored copy
    is returned, under its own id).
    """

    def __init__(self, writer: BackgroundWriter) -> None:
        self._writer, self._flushed = writer, False

    def _store(self) -> Any:
        if not self._flushed:
            self._writer.flush()
            self._flushed = True
        return self._writer.store

    def stored_id(self, episode_id: str) -> str:
        """The id the store holds ``episode_id``'s content under (itself unless it was a duplicate)."""
        self._store()
        return self._writer.aliases.get(episode_id, episode_id)

    _id = stored_id

    def get(self, episode_id: str) -> Episode:
        return self._store().get(self._id(episode_id))

    def get_many(self, episode_ids: Sequence[str]) -> list[Episode]:
        return self._store().get_many([self._id(e) for e in episode_ids])

    def index_row(self, episode_id: str) -> Any:
        return self._store().index_row(self._id(episode_id))

    def slice(self, episode_id: str, start: int = 0, stop: int | None = None) -> list[Any]:
        return self._store().slice(self._id(episode_id), start, stop)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store(), name)


def readable(sink: Any) -> Any:
    """The store behind ``sink``, for code that reads it back.

    A read waits for the queued writes, and only a read does: a reader that never reads costs nothing.
    """
    return _FlushingReader(sink) if isinstance(sink, BackgroundWriter) else sink
