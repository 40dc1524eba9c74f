"""Tool-call metrics for the trainer's logger, summed from the turns' ``info["tool_stats"]``.

The tool environment records, per turn, the ``calls``/``errors``/``timeouts`` of each tool in
that turn (see :mod:`arborl.env.tool_env`); the rollout keeps them in ``Turn.info``. This sums
them over a batch of episodes into flat metric names:

* ``tools/<name>/calls``, ``tools/<name>/errors``, ``tools/<name>/timeouts``: totals per tool;
* ``tools/calls_per_episode``: all calls divided by the number of episodes;
* ``tools/time_share``: the tools' share of the rollout's wall time, from the turns' timings:
  ``sum(tool latency) / sum(generate + env)`` over every turn. Each turn's ``generate`` is the
  wall time of its batch's generation and ``env`` its own step (tool calls included), so this is
  the fraction of an episode's time spent waiting for its tools (the steps of a batch overlap).

:func:`episode_metrics` averages what a tool env reports when an episode ends
(``info["metrics"]`` of the last turn, see ``ToolEnv(metrics=...)``): each name's mean over the
episodes that report it, and ``<name>_n``, how many did. The evaluation adds them to its result
(``summary.json``, probe rows) and RL rows carry them as ``train/<name>``.
"""

from __future__ import annotations

from collections.abc import Iterable

from arborl.trajectory.schema import Episode

_KINDS = ("calls", "errors", "timeouts")


def tool_metrics(episodes: Iterable[Episode]) -> dict[str, float]:
    """Totals per tool and the mean number of calls per episode (every turn of every episode)."""
    episodes = list(episodes)
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
    out["tools/time_share"] = tool_time_share(episodes)
    return out


def tool_time_share(episodes: Iterable[Episode]) -> float:
    """``sum(tool latency) / sum(generate + env time)`` over every turn (0.0 without timings)."""
    tool = wall = 0.0
    for ep in episodes:
        for turn in ep.turns:
            tool += float(turn.timings.get("tool", 0.0))
            wall += float(turn.timings.get("generate", 0.0)) + float(turn.timings.get("env", 0.0))
    return tool / wall if wall > 0 else 0.0


def episode_metrics(episodes: Iterable[Episode]) -> dict[str, float]:
    """Per name of the episodes' end-of-episode ``info["metrics"]``: the mean and ``<name>_n``.

    The mean is over the episodes reporting the name (one some episodes leave out, e.g. a
    2-hop-only metric, is averaged over the others); ``<name>_n`` is their number.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for ep in episodes:
        last = ep.path()[-1] if ep.turns else None
        values = last.info.get("metrics") if last is not None else None
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                sums[name] = sums.get(name, 0.0) + float(value)
                counts[name] = counts.get(name, 0) + 1
    out: dict[str, float] = {}
    for name in sorted(sums):
        out[name] = sums[name] / counts[name]
        out[f"{name}_n"] = float(counts[name])
    return out
