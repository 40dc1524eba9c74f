"""The real CLI end to end on a tiny budget, resume exactness, and clear errors on bad input."""

import json

import pytest
import torch
from clikit import arborl, sets
from safetensors.torch import load_file


def test_train_end_to_end_writes_outputs(tmp_path):
    run = tmp_path / "run"
    p = arborl("train", "examples/frozenlake.toml", *sets(run))
    assert "after SFT" in p.stdout and "after RL" in p.stdout
    summary = json.loads((run / "summary.json").read_text())
    for key in ("sft", "rl", "rl_gain", "env_steps", "tokens", "wall_s", "peak_rss_mb"):
        assert key in summary, key
    assert 0.0 <= summary["rl"]["success"] <= 1.0
    assert summary["env_steps"] > 0 and summary["tokens"] > 0
    assert (run / "learning_curve.png").stat().st_size > 1000
    assert (run / "policy" / "rl" / "model.safetensors").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in rows} == {"sft", "rl"}
    assert list((run / "tb").iterdir())
    # every stage persisted its episodes in the store
    from arborl.store import open_store

    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        for source in ("synth", "rl", "eval-sft", "eval-rl"):
            assert store.count(source=source) > 0, source


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    base = ["rl.iterations=4", "rl.eval_every=0", "rl.checkpoint_every=2"]
    arborl("train", "examples/frozenlake.toml", *sets(straight, [*base, 'stages=["synth","sft","rl"]']))
    arborl("train", "examples/frozenlake.toml", *sets(split, ["rl.iterations=2", "rl.eval_every=0", 'stages=["synth","sft","rl"]']))
    arborl("rl", "examples/frozenlake.toml", "--resume", *sets(split, base))
    a = load_file(straight / "policy" / "rl" / "model.safetensors")
    b = load_file(split / "policy" / "rl" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6, rtol=0), k


@pytest.mark.parametrize("args,needle", [
    (["--set", "rl.lr=fast"], "rl.lr: expected a number"),
    (["--set", "rl.bogus=1"], "unknown config key 'rl.bogus'"),
    (["--set", 'env.cls="nowhere.mod:Env"'], "env.cls"),
    (["--set", 'env.cls="tests.e2e.broken_env:NoStateKey"', "--set", "stages=[\"synth\"]"], "state_key"),
])
def test_bad_input_gets_a_clear_error(tmp_path, args, needle):
    p = arborl("train", "examples/frozenlake.toml", "--set", f'run_dir="{tmp_path}"', *args, check=False)
    assert p.returncode != 0
    assert needle in p.stderr, p.stderr


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    p = arborl("rl", "examples/frozenlake.toml", "--set", f'run_dir="{tmp_path}"', "--set",
               f'policy.init="{tmp_path}/no-such-model"', check=False)
    assert p.returncode != 0 and "no-such-model" in p.stderr
