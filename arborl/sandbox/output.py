"""Read a child's stdout/stderr with a byte cap and a deadline (never plain ``communicate()``).

:func:`collect` multiplexes the output pipes and a "done" fd (a pidfd, or the zygote's reply
socket) with ``selectors``. It keeps at most ``cap`` bytes per stream and keeps *draining* (and
dropping) the rest, so a flooding child neither blocks nor grows the caller's memory. At the
deadline it calls ``on_deadline`` (the backend's kill) and gives the kill one second to land.
Once the child is done it only drains what is already buffered: a descendant that escaped and
still holds the pipe cannot make the caller wait.
"""

from __future__ import annotations

import os
import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_CHUNK = 1 << 16
# After "done", wait this long for the pipes' EOF before giving up on stragglers.
_DRAIN_GRACE_S = 0.25
# After a deadline kill, how long to wait for "done" before returning anyway.
_KILL_GRACE_S = 1.0


@dataclass
class Captured:
    """What :func:`collect` read.

    Attributes:
        streams: Captured bytes per fd, at most ``cap`` each.
        dropped: Bytes read beyond the cap, per fd.
        timed_out: The deadline passed before the child was done.
        done: The done fd became readable (child finished) before we returned.
    """

    streams: dict[int, bytearray] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)
    timed_out: bool = False
    done: bool = False

    @property
    def truncated(self) -> bool:
        """Whether any stream went over the cap."""
        return any(self.dropped.values())

    def text(self, fd: int) -> str:
        """Decoded text of one stream (UTF-8, undecodable bytes replaced)."""
        return bytes(self.streams.get(fd, b"")).decode("utf-8", errors="replace")


def _keep(buf: bytearray, chunk: bytes, cap: int) -> int:
    """Append what fits of ``chunk`` below ``cap`` bytes to ``buf``; return how many were dropped."""
    room = max(cap - len(buf), 0)
    buf += chunk[:room]
    return max(len(chunk) - room, 0)


def read_capped(fd: int, buf: bytearray, cap: int) -> int:
    """Read a blocking fd to EOF in the calling thread, keeping the first ``cap`` bytes in ``buf``.

    For readers that each own one pipe (a thread per stream); the rest is drained and dropped.

    Returns:
        How many bytes were read in all (more than ``cap`` means the output was truncated).
    """
    total = 0
    while data := os.read(fd, _CHUNK):
        total += len(data)
        _keep(buf, data, cap)
    return total


def _drain(fd: int, cap: int, out: Captured) -> bool:
    """Read what is available from a non-blocking fd; return ``False`` at EOF."""
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        out.dropped[fd] += _keep(out.streams[fd], chunk, cap)


def collect(
    fds: list[int],
    done_fd: int,
    *,
    cap: int,
    deadline: float,
    on_deadline: Callable[[], None],
) -> Captured:
    """Capture ``fds`` until the child is done and the pipes close, or the deadline passes.

    Args:
        fds: Read ends of the output pipes (set non-blocking here).
        done_fd: Becomes readable when the child has finished (pidfd or reply socket).
        cap: Maximum bytes kept per stream.
        deadline: ``time.monotonic()`` value at which ``on_deadline`` is called.
        on_deadline: Kills the child (and its descendants).

    Returns:
        The captured output and whether the deadline hit.
    """
    out = Captured(streams={fd: bytearray() for fd in fds}, dropped=dict.fromkeys(fds, 0))
    open_fds = set(fds)
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(done_fd, selectors.EVENT_READ)
        stop_at: float | None = None  # set once done or killed: the final grace period
        while open_fds or not out.done:
            now = time.monotonic()
            if stop_at is None and now >= deadline:
                out.timed_out = True
                on_deadline()
                stop_at = now + _KILL_GRACE_S
            limit = stop_at if stop_at is not None else deadline
            if now >= limit:
                break
            for key, _ in sel.select(timeout=max(0.0, limit - now)):
                fd = int(key.fd)  # type: ignore[arg-type]
                if fd == done_fd:
                    out.done = True
                    sel.unregister(done_fd)
                    grace = now + _DRAIN_GRACE_S
                    stop_at = grace if stop_at is None else min(stop_at, grace)
                elif not _drain(fd, cap, out):
                    sel.unregister(fd)
                    open_fds.discard(fd)
        for fd in open_fds:  # last non-blocking sweep of anything already buffered
            _drain(fd, cap, out)
    return out
