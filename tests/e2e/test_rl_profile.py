"""Through the CLI: every RL iteration logs its per-phase profile, and the run summarises it."""

from __future__ import annotations

import json

import pytest
from clikit import arborl, sets

from arborl.train.profile import PHASES


def test_a_real_run_logs_every_phase_and_summarises_them(tmp_path):
    run = tmp_path / "run"
    p = arborl("train", "examples/frozenlake.toml", *sets(run, ["rl.update_threads=2"]))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert rl and all(r["time/rollout"] > 0 and r["time/branch"] > 0 and r["time/update"] > 0 for r in rl)
    for r in rl:  # the phases are disjoint blocks of the iteration
        assert sum(r[f"time/{k}"] for k in PHASES) <= r["time/iteration"] + 1e-6
    prof = json.loads((run / "summary.json").read_text())["rl_profile"]
    assert prof["iterations"] == len(rl)
    assert prof["iteration_s"] == pytest.approx(sum(r["time/iteration"] for r in rl) / len(rl))
    assert "RL iteration (mean)" in p.stdout and "update" in p.stdout
