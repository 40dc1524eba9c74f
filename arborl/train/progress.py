"""Progress bars with ETA and the last step's numbers (rich); off with ``ARBORL_PROGRESS=0``.

A stage hands :func:`progress` a ``status`` dict and updates it inside its loop (e.g. the loss,
success and reward of the last iteration); the bar shows what the dict holds after each item.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")


def status_text(status: Mapping[str, float | int | str]) -> str:
    """``loss 0.123  success 0.500`` from a status dict (floats with 3 decimals)."""
    return "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in status.items())


def progress(items: Iterable[T], label: str, total: int | None = None,
             status: Mapping[str, float | int | str] | None = None) -> Iterator[T]:
    """Iterate ``items`` showing a bar with count, elapsed time, ETA and ``status`` after each item."""
    if os.environ.get("ARBORL_PROGRESS", "1") == "0":
        yield from items
        return
    if total is None:
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(label, total=total, status="")
        for item in items:
            yield item
            bar.update(task, advance=1, status=status_text(status or {}))
