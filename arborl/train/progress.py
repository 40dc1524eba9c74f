"""Progress bars with ETA for long stages (rich), quiet when stdout is not a terminal and ARBORL_PROGRESS=0."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
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


def progress(items: Iterable[T], label: str, total: int | None = None) -> Iterator[T]:
    """Iterate ``items`` showing a bar with count, elapsed time and ETA."""
    if os.environ.get("ARBORL_PROGRESS", "1") == "0":
        yield from items
        return
    if total is None:
        total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(label, total=total)
        for item in items:
            yield item
            bar.advance(task)
