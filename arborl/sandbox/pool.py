"""The idle workers of a pooled backend (docker containers, wasm worker processes), and their shrinking.

A run takes an idle worker, or starts a new one when none is idle (concurrent callers), and
gives it back afterwards; so a burst of concurrent runs grows the pool. :class:`IdlePool` hands
out the most recently returned worker first, so after a burst the extra workers are the ones
that stay idle, and it retires every worker beyond ``idle_size`` that has been idle for
``shrink_after_s``: the pool shrinks back to its configured idle size instead of holding a
burst's workers (and their memory) until ``close()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class IdlePool(Generic[T]):
    """Idle workers, most recently returned first; the excess is retired after an idle period.

    Args:
        retire: Stops one worker for good (called from a background thread, or from
            :meth:`put` after :meth:`close`).
        idle_size: How many idle workers to keep however long they stay idle (>= 0).
        shrink_after_s: How long a worker beyond ``idle_size`` may stay idle (> 0).
    """

    def __init__(self, retire: Callable[[T], None], *, idle_size: int, shrink_after_s: float) -> None:
        if idle_size < 0:
            raise ValueError(f"idle_size must be >= 0, got {idle_size}")
        if not shrink_after_s > 0:
            raise ValueError(f"shrink_after_s must be > 0, got {shrink_after_s}")
        self.idle_size = idle_size
        self.shrink_after_s = shrink_after_s
        self._retire = retire
        self._items: list[tuple[T, float]] = []  # (worker, idle since), least recently returned first
        self._cond = threading.Condition()
        self._shrinker: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def get(self, timeout: float) -> T | None:
        """The most recently returned idle worker, waiting up to ``timeout`` s; ``None`` if none."""
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._closed, timeout)
            return self._items.pop()[0] if self._items else None

    def put(self, item: T) -> None:
        """Return a worker; it is retired at once if the pool is closed."""
        with self._cond:
            if not self._closed:
                self._items.append((item, time.monotonic()))
                self._cond.notify_all()
                if len(self._items) > self.idle_size and self._shrinker is None:
                    self._shrinker = threading.Thread(target=self._shrink, name="arborl-pool-shrink", daemon=True)
                    self._shrinker.start()
                return
        self._retire(item)

    def _shrink(self) -> None:
        """Retire idle workers beyond ``idle_size`` as they pass ``shrink_after_s``; end when none are."""
        while True:
            with self._cond:
                if self._closed or len(self._items) <= self.idle_size:
                    self._shrinker = None
                    return
                wait = self._items[0][1] + self.shrink_after_s - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)  # a put or get changes what is oldest: look again
                    continue
                item = self._items.pop(0)[0]
            self._retire(item)

    def close(self) -> list[T]:
        """Stop handing out workers; return the idle ones (the caller stops them)."""
        with self._cond:
            self._closed = True
            items = [item for item, _ in self._items]
            self._items.clear()
            self._cond.notify_all()
        return items
