"""Ctrl-C during a run: stop at an iteration boundary, keep the last checkpoint, say how to continue.

The first SIGINT during RL only sets a flag: the iteration in flight finishes, a checkpoint of it
is written, and the run stops with :class:`Interrupted`. A second SIGINT drops the iteration
(``KeyboardInterrupt`` as usual); the newest checkpoint written before it is kept.

The step loops of the other stages (synth's batches, SFT's and mid-training's steps) stop the same
way at the end of the step in flight, without a checkpoint: ``--resume`` redoes the stage. A
``KeyboardInterrupt`` raised wherever the main thread happens to be can land inside a library's
bookkeeping (TensorBoard's writer queue, a SQLite write) and leave it half done; a flag read
between steps cannot. A second SIGINT stops at once, as does the first outside a step loop.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class Interrupted(Exception):
    """The run was stopped by the user; the message says where and how to continue."""

    def __init__(self, stage: str, iteration: int | None = None, checkpoint: Path | None = None) -> None:
        self.stage, self.iteration, self.checkpoint = stage, iteration, checkpoint
        if iteration is not None:
            where = f"stopped at iteration {iteration}; continue with --resume"
            kept = f" (checkpoint {checkpoint})" if checkpoint is not None else ""
        else:
            where = f"stopped during {stage}; continue with --resume"
            kept = f" ({stage} starts again; finished stages are kept)"
        super().__init__(where + kept)


ITERATION = "finishing this iteration and writing a checkpoint (Ctrl-C again to drop it)"
"""What the first Ctrl-C during RL announces."""

STEP = "stopping after this step (Ctrl-C again to stop at once)"
"""What the first Ctrl-C during another stage's step loop announces."""


class StopRequest:
    """While active (a ``with`` block in the main thread), the first Ctrl-C sets :attr:`requested`.

    ``notice`` is printed when it does; the second Ctrl-C raises ``KeyboardInterrupt``.
    """

    def __init__(self, notice: str = ITERATION) -> None:
        self.requested = False
        self.notice = notice
        self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        # straight to the descriptor: print() here could re-enter sys.stderr's buffer while the main
        # thread is inside a write to it, which raises RuntimeError ("reentrant call") at that write
        os.write(2, f"arborl: Ctrl-C: {self.notice}\n".encode())

    def check(self) -> None:
        """At the end of a step: raise ``KeyboardInterrupt`` if a Ctrl-C came during it.

        The pipeline turns it into :class:`Interrupted` naming the stage, as it does a second Ctrl-C.
        """
        if self.requested:
            raise KeyboardInterrupt

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def between_steps(items: Iterable[T]) -> Iterator[T]:
    """Yield ``items``, one step each; a Ctrl-C during a step stops the loop when that step ends.

    The stop is ``KeyboardInterrupt`` raised here, before the next item, under a :class:`StopRequest`
    (a second Ctrl-C stops at once). The handler it installs goes when the loop ends, by
    exhaustion, ``break`` or an exception (the generator is closed then).
    """
    with StopRequest(STEP) as stop:
        for item in items:
            yield item
            stop.check()
