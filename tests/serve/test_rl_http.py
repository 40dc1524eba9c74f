"""`arborl rl` with policy.backend = "http": rollouts through arborl serve, weights pushed every iteration."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from arborl.serve import PolicyServer, ServedModel
from arborl.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl, sets  # noqa: E402


@pytest.mark.slow
def test_rl_rolls_out_through_arborl_serve_and_syncs_weights_every_iteration(tmp_path):
    run = tmp_path / "run"
    arborl("train", "examples/frozenlake.toml", *sets(run, ['stages=["synth","sft"]']))
    with PolicyServer(ServedModel(run / "policy" / "sft", device="cpu")) as server:
        extra = ['policy.backend="http"', f'policy.urls=["{server.url}"]', 'stages=["rl"]', "rl.branch=false"]
        arborl("rl", "examples/frozenlake.toml", *sets(run, extra))
        assert server.served.policy_version == 1  # iterations 0 and 1 each pushed their weights first
        assert server.served.path == str(run / "policy" / "serving")
    store = open_store(f"sqlite:///{run}/trajectories.db")
    eps = list(store.iter_episodes(source="rl"))
    assert {(e.iteration, t.policy_version) for e in eps for t in e.turns} == {(0, 0), (1, 1)}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [r for r in rows if r.get("stage") == "rl"]
    assert len(rl_rows) == 2 and all(r["train/env_errors"] == 0 for r in rl_rows)


@pytest.mark.slow
def test_http_backend_config_errors_name_the_fix(tmp_path):
    base = sets(tmp_path / "run", ['stages=["rl"]'])
    p = arborl("rl", "examples/frozenlake.toml", *base, "--set", 'policy.backend="http"', check=False)
    assert p.returncode == 2 and "policy.urls" in p.stderr and "arborl serve" in p.stderr
    p = arborl("rl", "examples/frozenlake.toml", *base, "--set", 'policy.backend="http"', "--set",
               'policy.urls=["http://127.0.0.1:9"]', "--set", "rl.branch=true", check=False)
    assert p.returncode == 2 and "rl.branch = false" in p.stderr
    p = arborl("rl", "examples/frozenlake.toml", *base, "--set", 'policy.backend="http"', "--set",
               'policy.urls=["http://127.0.0.1:9"]', "--set", "rl.branch=false", check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "weight sync to http://127.0.0.1:9 failed" in lines[0], p.stderr
    assert "Check policy.urls" in lines[0]
