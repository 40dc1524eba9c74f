"""Env calls of a batch on worker threads, each under a deadline.

The rollout engine steps the environments of a turn together (:func:`run_calls`), so a turn's
env phase takes as long as its slowest step, not the sum of them: a slow tool call of one
episode runs while the other episodes' steps finish. Results come back in submission order,
so the episodes do not depend on thread timing.

A call that passes its deadline is reported as :class:`Overdue`; its thread cannot be killed, so
it is left to finish on its own (a daemon thread: it never holds up interpreter exit) and a new
worker takes its place. The caller must not use whatever that call was working on again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Overdue:
    """The result of a call that did not return within ``timeout_s`` seconds of starting."""

    timeout_s: float


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: Future = field(default_factory=Future)
    started: float | None = None
    abandoned: bool = False


class WorkerPool:
    """``workers`` daemon threads running zero-argument calls; :meth:`run_calls` waits with deadlines.

    Args:
        workers: Threads (>= 1). A thread stuck in an overdue call is replaced, so the pool keeps
            ``workers`` threads free to take work.
    """

    def __init__(self, workers: int) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"WorkerPool: workers is {workers!r}; use an integer >= 1")
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed, self.workers = False, workers
        for _ in range(workers):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, name="arborl-env-step", daemon=True).start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue
            job.started = time.monotonic()
            try:
                job.future.set_result(job.fn())
            except BaseException as exc:  # handed to the caller, who records it on the episode
                job.future.set_exception(exc)
            if job.abandoned:
                return  # a replacement took this thread's place while it was overdue

    def run_calls(self, calls: Sequence[Callable[[], Any]], timeout_s: float) -> list[Any]:
        """Run ``calls`` concurrently; their results in order, :class:`Overdue` for those past the deadline.

        An exception of a call is raised here, after every call has finished or passed its
        deadline (callers that want every outcome catch inside the call).
        """
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        jobs = [_Job(fn) for fn in calls]
        for job in jobs:
            self._jobs.put(job)
        out: list[Any] = []
        for job in jobs:
            out.append(job.future.result() if self._finish(job, timeout_s) else Overdue(timeout_s))
        return out

    def _finish(self, job: _Job, timeout_s: float) -> bool:
        """Wait for ``job`` until ``timeout_s`` after it started; False (and a new worker) if it is overdue."""
        while not job.future.done():
            started = job.started
            left = timeout_s if started is None else started + timeout_s - time.monotonic()
            if started is not None and left <= 0:
                job.abandoned = True  # its thread exits once the call returns
                self._spawn()
                return False
            wait_futures([job.future], timeout=max(left, 1e-3))
        return True

    def close(self) -> None:
        """Let the idle workers exit (idempotent); overdue calls keep their threads until they return."""
        if not self._closed:
            self._closed = True
            for _ in range(self.workers):  # one stop mark per free worker (replacements included)
                self._jobs.put(None)
