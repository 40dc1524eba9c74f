"""The whole tiny pipeline (examples/tiny.toml: synth -> sft -> rl -> eval) with each critic-based credit."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl  # noqa: E402


@pytest.mark.parametrize("credit", ["turn_ppo", "archer"])
def test_tiny_example_trains_with_a_critic(tmp_path, credit):
    # tiny.toml keeps its branch rollouts: the critics then also see branch episodes, whose re-played
    # turns are states for the critic but get no advantage
    run = tmp_path / "run"
    arborl("train", "examples/tiny.toml", "--set", f'run_dir="{run}"', "--set", f"rl.credit={credit}",
           "--set", "report_to=[]")
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["stage"] == "rl"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/branches"] > 0 and any(k.startswith("critic/") for k in r) for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["rl"]["credit"] == credit and "rl" in summary
