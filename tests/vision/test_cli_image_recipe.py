"""The image recipe end to end through the real CLI, on a tiny budget: synth -> sft -> rl -> eval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arborl.store import open_store

ROOT = Path(__file__).resolve().parents[2]
TINY = ["synth.episodes=24", "sft.steps=3", "sft.eval_every=0", "rl.iterations=2", "rl.tasks_per_iter=4",
        "rl.eval_every=0", "eval.episodes=6", "policy.tokenizer_episodes=10", "policy.model.hidden_size=32",
        "policy.model.intermediate_size=64"]


@pytest.mark.slow
def test_the_image_recipe_runs_end_to_end_and_stores_images_by_reference(tmp_path):
    run = tmp_path / "run"
    sets = [a for kv in [*TINY, f'run_dir="{run}"'] for a in ("--set", kv)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "arborl.cli", "train", str(ROOT / "examples/frozenlake_image.toml"),
                        *sets], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert {"sft", "rl"} <= set(summary) and 0.0 <= summary["rl"]["success"] <= 1.0
    assert json.loads((run / "policy" / "rl" / "config.json").read_text())["model_type"] == "arborl_patch_vlm"
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        for source in ("synth", "rl", "eval-rl"):
            ep = next(iter(store.iter_episodes(source=source)))
            refs = [m for t in ep.turns for m in t.media]
            assert len(refs) == len(ep.turns) and all(r.mime == "image/png" for r in refs)
            assert store.get_media(refs[0]).startswith(b"\x89PNG")
    for part in run.glob("trajectories.db*"):  # the index (and its WAL) holds no picture
        if part.is_file():
            assert b"\x89PNG" not in part.read_bytes()
