"""Wall-clock profile of each RL iteration, phase by phase.

An iteration is timed as ``with phase("rollout"): ...`` blocks of one :class:`PhaseTimer`; its
:meth:`~PhaseTimer.row` is logged with the iteration's metrics as ``time/<phase>`` (seconds) plus
``time/iteration``. :func:`profile_summary` turns the logged rows into the run's profile (mean
seconds per iteration and share of the iteration), which ``summary.json`` keeps under
``rl_profile`` and the final table prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

PHASES = ("rollout", "branch", "store", "credit", "ref_logp", "update", "eval")
"""The phases of an RL iteration, in the order they run (``time/<phase>`` metrics)."""


class PhaseTimer:
    """Seconds spent in each named phase since construction (a phase may be entered more than once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (one of :data:`PHASES`)."""
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r}; use one of {PHASES}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def row(self) -> dict[str, float]:
        """``time/<phase>`` for every phase and ``time/iteration`` (wall time since construction)."""
        return {**{f"time/{k}": v for k, v in self.seconds.items()},
                "time/iteration": time.perf_counter() - self._t0}


def profile_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean seconds per iteration and share of the iteration of each phase, over the logged ``rows``.

    Args:
        rows: metrics rows of the RL stage (rows without ``time/iteration`` are ignored).

    Returns:
        ``{"iterations": n, "iteration_s": mean, "phases": {name: {"s": mean, "share": fraction}}}``,
        with an ``other`` phase for time outside every timed block; empty when no row was timed.
    """
    timed = [r for r in rows if "time/iteration" in r]
    if not timed:
        return {}
    n = len(timed)
    total = sum(r["time/iteration"] for r in timed) / n
    phases = {k: sum(r.get(f"time/{k}", 0.0) for r in timed) / n for k in PHASES}
    phases["other"] = max(0.0, total - sum(phases.values()))
    return {"iterations": n, "iteration_s": total,
            "phases": {k: {"s": v, "share": v / total if total > 0 else 0.0} for k, v in phases.items()}}


def profile_lines(profile: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, "0.52 s (14%)")`` rows of a :func:`profile_summary` result, for the final table."""
    if not profile:
        return []
    out = [("RL iteration (mean)", f"{profile['iteration_s']:.2f} s")]
    for name, p in profile["phases"].items():
        out.append((f"  {name}", f"{p['s']:.3f} s ({100 * p['share']:.0f}%)"))
    return out


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (``0``: leave the setting), then restore it.

    Lets one phase of an iteration (the update) use more threads than the others (rollouts,
    whose many tiny ops only wait at every intra-op barrier).
    """
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
