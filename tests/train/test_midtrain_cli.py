"""``arborl train`` with ``synth -> midtrain -> sft -> merge -> eval`` and ``arborl midtrain`` on a tiny budget."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from arborl.store import open_store
from arborl.train.midtrain import NOISY_SOURCE
from tests.e2e.clikit import arborl, sets

MID = ["midtrain.steps=4", "midtrain.seq_len=256", "midtrain.batch_size=2", "midtrain.synth_episodes=40",
       "midtrain.warmup_steps=1", 'merge.models=["midtrain", "sft"]', "merge.method=linear"]


@pytest.mark.slow
def test_pipeline_with_midtrain_and_merge(tmp_path):
    run = tmp_path / "run"
    stages = 'stages=["synth", "midtrain", "sft", "merge", "eval"]'
    arborl("train", "examples/frozenlake.toml", *sets(run, [*MID, stages, "sft.eval_every=0"]))
    summary = json.loads((run / "summary.json").read_text())
    for name in ("midtrain", "sft", "merge"):
        assert 0.0 <= summary[name]["success"] <= 1.0, name
    assert summary["midtrain_tokens"] > 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "midtrain"] == [1, 2, 3, 4]
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        noisy = list(store.iter_episodes(source=NOISY_SOURCE))
        demos = list(store.iter_episodes(source="synth"))
    assert len(noisy) == 40 and any(not e.success for e in noisy)  # the noisy set keeps failures
    assert all(e.success for e in demos)
    # SFT started from the mid-trained policy, and the merge is the mean of the two
    mid, sft, merged = (load_file(str(run / "policy" / n / "model.safetensors")) for n in ("midtrain", "sft", "merge"))
    for k in mid:
        torch.testing.assert_close(merged[k], (mid[k] + sft[k]) / 2)


@pytest.mark.slow
def test_midtrain_command_reads_jsonl_sources(tmp_path):
    run = tmp_path / "run"
    arborl("synth", "examples/frozenlake.toml", *sets(run))
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        lines = [e.to_json() for e in store.iter_episodes(source="synth")]
    (tmp_path / "demos.jsonl").write_text("\n".join(lines) + "\n")
    data = f'midtrain.data=["store:synth", "{tmp_path / "demos.jsonl"}"]'
    arborl("midtrain", "examples/frozenlake.toml", *sets(run, [*MID, data, "midtrain.weights=[1.0, 3.0]"]))
    assert (run / "policy" / "midtrain" / "model.safetensors").is_file()
    bad = arborl("midtrain", "examples/frozenlake.toml", "--overwrite",
                 *sets(run, [*MID, f'midtrain.data=["{tmp_path / "missing.jsonl"}"]']), check=False)
    assert bad.returncode == 2 and "neither store:TAG nor a JSONL file" in bad.stderr
