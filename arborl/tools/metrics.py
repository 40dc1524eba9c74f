"""Tool-call metrics for the trainer's logger, summed from the turns' ``info["tool_stats"]``.

The tool environment records, per turn, the ``calls``/``errors``/``timeouts`` of each tool in
that turn (see :mod:`arborl.env.tool_env`); the rollout keeps them in ``Turn.info``. This sums
them over a batch of episodes into flat metric names:

* ``tools/<name>/calls``, ``tools/<name>/errors``, ``tools/<name>/timeouts``: totals per tool;
* ``tools/calls_per_episode``: all calls divided by the number of episodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from arborl.trajectory.schema import Episode

_KINDS = ("calls", "errors", "timeouts")


def tool_metrics(episodes: Iterable[Episode]) -> dict[str, float]:
    """Totals per tool and the mean number of calls per episode (every turn of every episode)."""
    totals: dict[str, dict[str, int]] = {}
    n_episodes = 0
    for ep in episodes:
        n_episodes += 1
        for turn in ep.turns:
            stats = turn.info.get("tool_stats")
            if not isinstance(stats, dict):
                continue
            for name, counts in stats.items():
                into = totals.setdefault(str(name), dict.fromkeys(_KINDS, 0))
                for kind in _KINDS:
                    value = counts.get(kind, 0) if isinstance(counts, dict) else 0
                    into[kind] += int(value) if isinstance(value, int) else 0
    out = {f"tools/{name}/{kind}": float(c[kind]) for name, c in sorted(totals.items()) for kind in _KINDS}
    calls = sum(c["calls"] for c in totals.values())
    out["tools/calls_per_episode"] = calls / n_episodes if n_episodes else 0.0
    return out
