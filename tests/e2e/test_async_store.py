"""Through the CLI: writing the store in the background trains exactly as the synchronous read-back did."""

from __future__ import annotations

import json
import sqlite3

from clikit import arborl, sets


def _rl_rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time")} for r in rows if r["stage"] == "rl"]


def _stored(run):
    with sqlite3.connect(run / "trajectories.db") as db:
        return sorted(db.execute("SELECT source, content_hash FROM episodes").fetchall())


def test_async_store_gives_the_same_run_and_the_same_store(tmp_path):
    runs = {}
    for flag in ("false", "true"):
        runs[flag] = tmp_path / flag
        arborl("train", "examples/frozenlake.toml", *sets(runs[flag], [f"rl.async_store={flag}"]))
    assert _rl_rows(runs["true"]) == _rl_rows(runs["false"]) and len(_rl_rows(runs["true"])) == 2
    stored = _stored(runs["true"])
    assert stored == _stored(runs["false"])
    assert {s for s, _ in stored} >= {"synth", "rl", "rl-branch", "eval-rl"}
