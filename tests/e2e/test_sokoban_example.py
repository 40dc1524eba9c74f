"""examples/sokoban.toml loads and runs the whole pipeline on a tiny budget through the CLI."""

import json

import pytest
from clikit import ROOT, arborl, sets

from arborl.config import load_config
from arborl.train.config import TrainConfig


def test_the_sokoban_example_loads_with_an_expert_and_a_finite_action_set():
    from arborl.train.common import env_factory

    cfg = load_config(TrainConfig, ROOT / "examples" / "sokoban.toml")
    env = env_factory(cfg.env)()
    obs, _ = env.reset(seed=3)
    turns = 0
    while True:  # the BFS expert solves the room within the rollout budget
        res = env.step(env.expert_action())
        turns += 1
        if res.terminated or res.truncated:
            break
    env.close()
    assert res.terminated and turns <= cfg.rollout.max_turns
    assert list(env.actions) == ["Up", "Down", "Left", "Right"]


@pytest.mark.slow
def test_the_sokoban_example_trains_and_evaluates_on_a_tiny_budget(tmp_path):
    run = tmp_path / "sok"
    p = arborl("train", "examples/sokoban.toml", *sets(run, ["report_to=[]", "rollout.max_turns=8"]))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["env"]["cls"] == "arborl.env.envs:Sokoban"
    assert summary["demo_episodes"] > 0 and summary["env_steps"] > 0
    assert 0.0 <= summary["rl"]["success"] <= 1.0
    assert "after RL" in p.stdout
