"""What the viewer shows, as JSON-able dicts read from a store and run directories (read only).

Everything here reads; nothing writes to the store or to a run directory. The functions are
shared by the web API (:mod:`arborl.view.api`) and the terminal view (:mod:`arborl.view.text`).

Definitions:

* **Episode list pages** are keyset pages of index rows, newest or oldest first, with the
  store's own cursors (:meth:`~arborl.store.base.TrajectoryStore.query_index`); every filter,
  ``stop_reason`` included, runs in the backend.
* **A group** is the episodes sharing ``group_id`` with a given episode. The store indexes no
  group id, so they are found among the episodes of the same task type and iteration created
  within :data:`GROUP_WINDOW_S` seconds of it (a rollout group and its branches are written by
  one iteration, seconds apart), scanning at most :data:`GROUP_SCAN_LIMIT` index rows.
* **First divergence** of a group: the first main-path turn index at which the episodes' actions
  (``action_text``) are not all equal, or at which some episode has already ended.
* **Advantages** of a turn are shown when a run recorded them in ``Turn.info["advantages"]``
  (a mapping from credit method to a number) or ``Turn.info["advantage"]`` (one number).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arborl.store.base import IndexRow
from arborl.trajectory.schema import Episode, Turn

GROUP_WINDOW_S = 3600.0
"""Half-width of the creation-time window in which a group's episodes are looked for."""
GROUP_SCAN_LIMIT = 50_000
"""Most index rows read to find one group."""
MAX_PAGE = 500
"""Largest page size the list takes."""


def list_page(store: Any, filters: dict[str, Any], *, stop_reason: str | None = None, order: str = "newest",
              limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
    """One page of index rows: ``{"episodes": [...], "next_cursor": str | None}``.

    Args:
        store: An open store.
        filters: Keyword filters of :class:`~arborl.store.base.Filters`.
        stop_reason: Keep rows with this stop reason only (``"env_error"``: episodes that ended on an error).
        order: ``"newest"`` or ``"oldest"`` first (by ``created_at``, ties by insertion order).
        limit: Page size, 1..:data:`MAX_PAGE`.
        cursor: ``next_cursor`` of the previous page (in the same order).

    Raises:
        ValueError: a bad order, limit or cursor, or an unknown filter.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    if stop_reason is not None:
        filters = {**filters, "stop_reason": stop_reason}
    try:
        rows, nxt = store.query_index(limit=limit, cursor=cursor, order=order, **filters)
    except TypeError as e:  # an unknown filter name
        raise ValueError(str(e)) from None
    return {"episodes": [r.to_dict() for r in rows], "next_cursor": nxt}


def _num(x: Any) -> Any:
    """A float JSON can carry (NaN and infinities become ``None``)."""
    return x if not isinstance(x, float) or math.isfinite(x) else None


def advantages(turn: Turn) -> dict[str, float]:
    """The advantages a run recorded for this turn, by credit method (see the module docstring)."""
    adv = turn.info.get("advantages")
    if isinstance(adv, dict):
        return {str(k): float(v) for k, v in adv.items() if isinstance(v, int | float)}
    one = turn.info.get("advantage")
    return {"advantage": float(one)} if isinstance(one, int | float) else {}


def turn_json(turn: Turn, decode: Any = None) -> dict[str, Any]:
    """One turn for the page: texts, tool call, outcome, timings and its output tokens.

    Args:
        turn: The turn.
        decode: Optional ``(token_ids) -> list[str]`` giving each output token's text.
    """
    ids = list(turn.output_ids)
    texts = decode(ids) if decode is not None and ids else [None] * len(ids)
    lps = list(turn.output_logprobs) + [None] * (len(ids) - len(turn.output_logprobs))
    mask = list(turn.output_mask) + [1] * (len(ids) - len(turn.output_mask))
    tokens = [{"id": i, "text": t, "logprob": _num(lp), "mask": m} for i, t, lp, m in zip(ids, texts, lps, mask, strict=True)]
    tc = turn.tool_call
    return {
        "turn_id": turn.turn_id, "parent_id": turn.parent_id, "index": turn.index,
        "observation": turn.observation, "media": [{"mime": m.mime, "k": k} for k, m in enumerate(turn.media)],
        "action_text": turn.action_text, "action": turn.action,
        "tool_call": None if tc is None else {"name": tc.name, "arguments": tc.arguments, "call_id": tc.call_id},
        "valid": turn.valid, "result": turn.result, "state_key": turn.state_key, "reward": _num(turn.reward),
        "terminated": turn.terminated, "truncated": turn.truncated, "error": turn.error,
        "timings": {k: _num(v) for k, v in turn.timings.items()}, "policy_version": turn.policy_version,
        "advantages": advantages(turn), "n_prompt_tokens": len(turn.prompt_ids), "tokens": tokens,
        "info": {k: v for k, v in turn.info.items() if k not in ("advantages", "advantage")},
    }


def episode_head(ep: Episode) -> dict[str, Any]:
    """Episode-level fields: ids, scores, provenance, metadata (no turns)."""
    path = ep.path()
    o = ep.origin
    return {
        "episode_id": ep.episode_id, "task_id": ep.task_id, "task_type": ep.task_type, "group_id": ep.group_id,
        "seed": ep.seed, "rewards": {k: _num(v) for k, v in ep.rewards.items()}, "reward": _num(ep.total_reward),
        "success": ep.success, "stop_reason": ep.stop_reason, "policy_version": ep.policy_version,
        "iteration": ep.iteration, "source": ep.source, "tags": list(ep.tags), "created_at": ep.created_at,
        "metadata": ep.metadata, "error": ep.metadata.get("error"), "n_turns": len(path), "n_nodes": len(ep.turns),
        "origin": None if o is None else {"of": o.of, "turn": o.turn, "kind": o.kind, "action": o.action,
                                          "state_key": o.state_key},
    }


def episode_json(ep: Episode, continuations: Sequence[IndexRow | Episode] = (), decode: Any = None) -> dict[str, Any]:
    """An episode as a tree: its turns (creation order, each with its children) and main path.

    Args:
        ep: The episode.
        continuations: Episodes that continue this one (their ``origin.of`` is ``ep``): shown as
            branches hanging off the turn they start from.
        decode: Optional token decoder (see :func:`turn_json`).
    """
    turns = [turn_json(t, decode) for t in ep.turns]
    children: dict[str | None, list[str]] = {}
    for t in ep.turns:
        children.setdefault(t.parent_id, []).append(t.turn_id)
    main = {t.turn_id for t in ep.path()}
    path_ids = [t.turn_id for t in ep.path()]
    for t in turns:
        t["children"] = children.get(t["turn_id"], [])
        t["on_main_path"] = t["turn_id"] in main
    branches = []
    for c in continuations:
        if isinstance(c, Episode) and c.origin is not None and c.origin.of == ep.episode_id:
            at = path_ids[c.origin.turn - 1] if 0 < c.origin.turn <= len(path_ids) else None
            branches.append({"episode_id": c.episode_id, "after_turn": at, "turn": c.origin.turn,
                             "kind": c.origin.kind, "action": c.origin.action, "reward": _num(c.total_reward),
                             "success": c.success, "n_turns": len(c.path())})
    return {"episode": episode_head(ep), "turns": turns, "roots": children.get(None, []),
            "main_path": path_ids, "continuations": branches}


def group_rows(store: Any, row: IndexRow) -> list[IndexRow]:
    """Index rows of the episodes in ``row``'s group, oldest first (see the module docstring)."""
    f = {"task_type": row.task_type, "iteration": row.iteration,
         "since": row.created_at - GROUP_WINDOW_S, "until": row.created_at + GROUP_WINDOW_S}
    out = []
    for k, r in enumerate(store.iter_rows(batch_size=2000, **f)):
        if r.group_id == row.group_id:
            out.append(r)
        if k + 1 >= GROUP_SCAN_LIMIT:
            break
    return out


def first_divergence(paths: Sequence[Sequence[Turn]]) -> int | None:
    """First turn index where the paths' actions differ or one path has ended; ``None`` if all agree."""
    if len(paths) < 2:
        return None
    for i in range(max(len(p) for p in paths)):
        if any(i >= len(p) for p in paths) or len({p[i].action_text for p in paths}) > 1:
            return i
    return None


def group_json(episodes: Sequence[Episode]) -> dict[str, Any]:
    """A group aligned by turn: each episode's main path, the first divergence, shared anchor states.

    ``anchors`` maps each state key visited by two or more episodes of the group to a small
    number (the page colours turns by it): the anchor-state groups that GiGPO-style credit compares.
    """
    paths = [ep.path() for ep in episodes]
    seen = Counter(k for p in paths for k in {t.state_key for t in p if t.state_key})
    shared = sorted(k for k, n in seen.items() if n > 1)
    return {
        "episodes": [{**episode_head(ep), "turns": [
            {"turn_id": t.turn_id, "index": i, "action_text": t.action_text, "observation": t.observation,
             "result": t.result, "reward": _num(t.reward), "valid": t.valid, "error": t.error,
             "state_key": t.state_key} for i, t in enumerate(p)]} for ep, p in zip(episodes, paths, strict=True)],
        "first_divergence": first_divergence(paths),
        "anchors": {k: n for n, k in enumerate(shared)},
    }


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` (a torn last line, from a run still writing, is skipped).

    Raises:
        FileNotFoundError: the run directory has no metrics.jsonl.
    """
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    with path.open() as fh:
        for line in fh:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict):
                rows.append({k: _num(v) for k, v in d.items()})
    return rows


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/summary.json``, or ``None`` when the run has not written one (yet)."""
    p = Path(run_dir) / "summary.json"
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def token_decoder(run_dirs: Sequence[Path]) -> Any:
    """``(ids) -> [text per token]`` from the first run's saved tokenizer, or ``None`` if none is found.

    Reads ``policy/*/tokenizer.json`` with the ``tokenizers`` library (no model is loaded).
    """
    for rd in run_dirs:
        for p in sorted(Path(rd).glob("policy/*/tokenizer.json")):
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(p))
            return lambda ids: [tok.decode([i], skip_special_tokens=False) for i in ids]
    return None
