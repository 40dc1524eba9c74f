"""`arborl train` with policy.lora_rank: RL moves only a low-rank update of the attention projections."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl, sets  # noqa: E402

RANK = 2


def _weights(d: Path):
    return load_file(str(d / "model.safetensors"))


def _check_low_rank(before, after):
    moved = 0
    for name, w in before.items():
        delta = after[name] - w
        if any(p in name for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            rank = int(torch.linalg.matrix_rank(delta, atol=1e-6)) if delta.abs().max() > 0 else 0
            assert rank <= RANK, f"{name}: the update has rank {rank}"
            moved += rank > 0
        else:  # embeddings, MLPs, norms: frozen
            assert delta.abs().max() == 0, name
    assert moved > 0


@pytest.mark.slow
def test_rl_with_lora_trains_the_adapter_exports_merged_and_resumes(tmp_path):
    run = tmp_path / "run"
    lora = [f"policy.lora_rank={RANK}", "rl.branch=false"]
    arborl("train", "examples/frozenlake.toml", *sets(run, [*lora, 'stages=["synth","sft","rl"]']))
    sft, rl = _weights(run / "policy" / "sft"), _weights(run / "policy" / "rl")
    assert not (run / "policy" / "rl" / "adapter_config.json").exists()  # the export is a plain checkpoint
    _check_low_rank(sft, rl)
    ckpt = run / "checkpoints" / "rl-000002"
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    # one more iteration from the checkpoint (adapter and optimizer loaded back onto the same base)
    # ends where a 3-iteration run ends
    arborl("rl", "examples/frozenlake.toml", *sets(run, [*lora, "rl.iterations=3"]), "--resume")
    assert (run / "checkpoints" / "rl-000003" / "adapter").is_dir()
    resumed = _weights(run / "policy" / "rl")
    _check_low_rank(sft, resumed)
    straight = tmp_path / "straight"
    arborl("train", "examples/frozenlake.toml", *sets(straight, [*lora, 'stages=["synth","sft","rl"]', "rl.iterations=3"]))
    for name, w in _weights(straight / "policy" / "rl").items():
        assert torch.allclose(resumed[name], w, atol=1e-6), name


@pytest.mark.slow
def test_rl_with_gradient_checkpointing_ends_where_a_plain_run_ends(tmp_path):
    base = ['stages=["synth","sft","rl"]', "rl.branch=false"]
    arborl("train", "examples/frozenlake.toml", *sets(tmp_path / "plain", base))
    arborl("train", "examples/frozenlake.toml", *sets(tmp_path / "ckpt", [*base, "policy.gradient_checkpointing=true"]))
    plain, ckpt = _weights(tmp_path / "plain" / "policy" / "rl"), _weights(tmp_path / "ckpt" / "policy" / "rl")
    sft = _weights(tmp_path / "plain" / "policy" / "sft")
    assert any(not torch.equal(plain[n], sft[n]) for n in plain)  # RL moved the weights
    for name, w in plain.items():
        assert torch.allclose(ckpt[name], w, atol=1e-5), name
