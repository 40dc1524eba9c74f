"""The advantage credit gave each turn, kept beside the run so that the explorer can show it.

Episodes are stored before credit is assigned (credit models may read the store), so the
advantages cannot ride on the stored turns. Instead each RL iteration appends one line to
``run_dir/advantages.jsonl``::

    {"iteration": 3, "credit": "gigpo", "turns": {"<turn_id>": 0.41, ...}}

with the per-turn advantage (before it is broadcast to the turn's tokens) of every turn that got
credit in that iteration. Turns that were not trained (a continuation's replay of its trunk, a
group the filter dropped, an episode dropped by ``rl.error_policy``) are left out. ``arborl view
STORE --run RUN_DIR`` reads the file back by turn id (:class:`AdvantageIndex`); several run
directories give one column per credit method.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

FILE = "advantages.jsonl"


def record_advantages(run_dir: str | Path, iteration: int, credit: str, episodes: Sequence[Any], episode: Tensor,
                      step: Tensor, advantage: Tensor, active: Tensor) -> int:
    """Append one iteration's per-turn advantages to ``run_dir/advantages.jsonl``.

    Args:
        run_dir: The run directory.
        iteration: The RL iteration (0-based).
        credit: The credit method's name (``rl.credit``).
        episodes: The episodes the step batch was built from (their ``path()`` gives the turns).
        episode: ``[N]`` episode index of each step.
        step: ``[N]`` index of each step within its episode's path.
        advantage: ``[N]`` advantage of each step.
        active: ``[N]`` bool, the steps that got credit.

    Returns:
        How many turns were recorded.
    """
    paths = [e.path() for e in episodes]
    turns = {
        paths[e][k].turn_id: round(float(a), 6)
        for e, k, a, on in zip(episode.tolist(), step.tolist(), advantage.tolist(), active.tolist(), strict=True)
        if on
    }
    with open(Path(run_dir) / FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps({"iteration": iteration, "credit": credit, "turns": turns}) + "\n")
    return len(turns)


class AdvantageIndex:
    """``turn_id -> {credit method: advantage}`` over the ``advantages.jsonl`` of several runs.

    Re-read when a file grew (a run still training), so a page opened later shows newer iterations.
    """

    def __init__(self, run_dirs: Sequence[str | Path]):
        self._files = [Path(r) / FILE for r in run_dirs]
        self._sizes: list[int] = []
        self._by_turn: dict[str, dict[str, float]] = {}

    def _refresh(self) -> None:
        sizes = [p.stat().st_size if p.exists() else 0 for p in self._files]
        if sizes == self._sizes:
            return
        by_turn: dict[str, dict[str, float]] = {}
        for p in self._files:
            for line in p.read_text(encoding="utf-8").splitlines() if p.exists() else ():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a torn last line of a run still writing
                    continue
                for tid, a in row.get("turns", {}).items():
                    by_turn.setdefault(tid, {})[str(row.get("credit", "advantage"))] = float(a)
        self._by_turn, self._sizes = by_turn, sizes

    def get(self, turn_id: str) -> dict[str, float]:
        """The advantages recorded for ``turn_id`` (empty when none was)."""
        self._refresh()
        return dict(self._by_turn.get(turn_id, {}))
