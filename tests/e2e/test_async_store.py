"""Through the CLI: writing the store in the background trains exactly as the synchronous read-back did."""

from __future__ import annotations

import json
import sqlite3

import pytest
from clikit import arborl, sets

from arborl.store import open_store


def _rl_rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time")} for r in rows if r["stage"] == "rl"]


def _stored(run):
    """Every stored episode by content. A continuation's hash covers its trunk's episode id (random
    per run), so continuations are compared by their trunk's content hash, where they branch and
    their own turns' tokens instead."""
    with sqlite3.connect(run / "trajectories.db") as db:
        rows = db.execute("SELECT episode_id, source, content_hash FROM episodes").fetchall()
    with open_store(f"sqlite:///{run}/trajectories.db", read_only=True) as store:
        episodes = list(store.iter_episodes())
    hash_of = {episode_id: h for episode_id, _, h in rows}
    out = [(source, h) for _, source, h in rows if source != "rl-branch"]
    for e in episodes:
        if e.origin is not None:
            own = tuple(tuple(t.output_ids) for t in e.path()[e.origin.turn:])
            out.append((e.source, hash_of[e.origin.of], e.origin.turn, e.origin.action, own))
    return sorted(out, key=repr)


@pytest.mark.slow
def test_async_store_gives_the_same_run_and_the_same_store(tmp_path):
    runs = {}
    for flag in ("false", "true"):
        runs[flag] = tmp_path / flag
        arborl("train", "examples/frozenlake.toml", *sets(runs[flag], [f"rl.async_store={flag}"]))
    assert _rl_rows(runs["true"]) == _rl_rows(runs["false"]) and len(_rl_rows(runs["true"])) == 2
    stored = _stored(runs["true"])
    assert stored == _stored(runs["false"])
    assert {r[0] for r in stored} >= {"synth", "rl", "rl-branch", "eval-rl"}
