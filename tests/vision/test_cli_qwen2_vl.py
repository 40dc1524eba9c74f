"""A stock Qwen2-VL checkpoint through the real CLI on image FrozenLake: `arborl train` (synth -> sft -> rl -> eval)
with ``--set policy.init=CKPT``, then `arborl eval --checkpoint` on what RL wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from arborl.store import open_store

from .conftest import save_tiny_qwen2_vl

ROOT = Path(__file__).resolve().parents[2]
TINY = ["synth.episodes=24", "sft.steps=3", "sft.eval_every=0", "rl.iterations=2", "rl.tasks_per_iter=4",
        "rl.eval_every=0", "eval.episodes=6", "rollout.sampling.max_new_tokens=8"]


def _cli(command: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "arborl.cli", command, str(ROOT / "examples/frozenlake_image.toml"),
                           *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


@pytest.mark.slow
def test_a_qwen2_vl_checkpoint_trains_and_evaluates_on_image_frozenlake_through_the_cli(tmp_path):
    ckpt = save_tiny_qwen2_vl(tmp_path / "qwen2_vl")
    run = tmp_path / "run"
    sets = [a for kv in [*TINY, f'run_dir="{run}"', f'policy.init="{ckpt}"'] for a in ("--set", kv)]
    p = _cli("train", *sets, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    rl = run / "policy" / "rl"
    cfg = json.loads((rl / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_vl" and cfg["architectures"] == ["Qwen2VLForConditionalGeneration"]
    assert (rl / "preprocessor_config.json").is_file()
    start, end = load_file(str(ckpt / "model.safetensors")), load_file(str(rl / "model.safetensors"))
    assert start.keys() == end.keys() and any(not (start[k] == end[k]).all() for k in start)  # SFT and RL trained it
    pad = cfg["image_token_id"]
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        for source in ("synth", "rl", "eval-rl"):
            ep = next(iter(store.iter_episodes(source=source)))
            refs = [m for t in ep.turns for m in t.media]
            assert len(refs) == len(ep.turns) and all(r.mime == "image/png" for r in refs)
            assert all(t.prompt_ids.count(pad) == 4 for t in ep.turns)  # 16 x 16 picture: 4 placeholders
    summary = json.loads((run / "summary.json").read_text())
    assert {"sft", "rl"} <= set(summary) and 0.0 <= summary["rl"]["success"] <= 1.0
    p = _cli("eval", "--checkpoint", str(rl), "--set", f'run_dir="{tmp_path / "eval"}"', "--set", "eval.episodes=4",
             "--set", "rollout.sampling.max_new_tokens=8", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert 0.0 <= json.loads((tmp_path / "eval" / "summary.json").read_text())["checkpoint"]["success"] <= 1.0
