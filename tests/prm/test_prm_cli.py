"""Each process-reward method through the real CLI: examples/tiny.toml with --set rl.credit=..."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl, cli_env  # noqa: E402


def run_tiny(run: Path, *extra: str, resume: bool = False):
    args = ["train", "examples/tiny.toml", "--set", f'run_dir="{run}"', "--set", "report_to=[]",
            "--set", "rl.branch=false"]
    for kv in extra:
        args += ["--set", kv]
    return arborl(*args, *(["--resume"] if resume else []), env=cli_env())


def rl_rows(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["stage"] == "rl"]


@pytest.mark.parametrize(("credit", "metric", "anchor"), [
    ("prm", "prm/score_progress", 0.0), ("implicit_prm", "prm/step_reward_abs", 0.0), ("istar", "prm/pairs", 0.0),
    ("prm", "prm/score_progress", 1.0),  # compare's prm_gigpo: GiGPO's anchor-state term beside the PRM's
])
def test_each_process_reward_method_runs_end_to_end(tmp_path, credit, metric, anchor):
    run = tmp_path / "run"
    run_tiny(run, f"rl.credit={credit}", "rl.prm_weight=0.5", f"rl.anchor_weight={anchor}")
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(metric in r and "prm/loss" in r for r in rows)
    assert (run / "policy" / "rl" / "model.safetensors").exists()
    state = torch.load(run / "checkpoints" / "rl-000002" / "trainer_state.pt", weights_only=False)
    assert "model" in state["credit_model"]  # the reward model travels with the checkpoint
    assert 'credit = "' + credit + '"' in (run / "config.toml").read_text()
    assert f"anchor_weight = {anchor}" in (run / "config.toml").read_text()


@pytest.mark.slow  # 30-60 s on a 2-core AVX2 host
def test_a_resumed_prm_run_continues_from_the_saved_reward_model(tmp_path):
    run = tmp_path / "run"
    run_tiny(run, "rl.credit=prm")
    saved = torch.load(run / "checkpoints" / "rl-000002" / "trainer_state.pt", weights_only=False)["credit_model"]
    run_tiny(run, "rl.credit=prm", "rl.iterations=3", resume=True)
    rows = rl_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the third iteration trained the restored model further: its optimizer counted on from iteration 2's steps
    after = torch.load(run / "checkpoints" / "rl-000003" / "trainer_state.pt", weights_only=False)["credit_model"]
    step = lambda s: max(int(v["step"]) for v in s["optimizer"]["state"].values())  # noqa: E731
    assert step(after) > step(saved) > 0

