"""``policy.device``: checked at config time, batches moved with the model, CPU runs unchanged."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arborl.config import ConfigError, load_config
from arborl.policy.model import to_device
from arborl.train.batch import TokenBatch
from arborl.train.config import TrainConfig
from arborl.train.midtrain import pack

ROOT = Path(__file__).resolve().parents[2]


def test_device_names_are_checked():
    with pytest.raises(ConfigError, match="policy.device is 'gpu'"):
        load_config(TrainConfig, None, ['policy.device="gpu"'])
    assert load_config(TrainConfig, None, ['policy.device="cpu"']).policy.device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_at_config_time():
    with pytest.raises(ConfigError, match="sees no GPU"):
        load_config(TrainConfig, None, ['policy.device="cuda:0"'])


def test_to_device_moves_every_tensor_field_and_leaves_a_batch_in_place_alone():
    batch = TokenBatch(*(torch.zeros(2, 3, dtype=torch.long) for _ in range(5)))
    assert to_device(batch, torch.device("cpu")) is batch  # CPU runs: no copy
    moved = to_device(batch, torch.device("meta"))
    assert all(getattr(moved, f).device.type == "meta" for f in ("input_ids", "attention_mask", "loss_mask",
                                                                 "old_logp", "step_of_token"))
    packed = to_device(pack([[1, 2, 3], [4, 5]], 4), torch.device("meta"))
    assert packed.attention_bias().device.type == "meta"  # the mid-training mask is built where the batch is


def _run(run_dir: Path, *overrides: str) -> None:
    sets = [a for o in ("rl.iterations=1", "eval.episodes=2", "report_to=[]", 'stages=["synth","sft","rl"]',
                        f'run_dir="{run_dir}"', *overrides) for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run([sys.executable, "-m", "arborl.cli", "train", str(ROOT / "examples" / "tiny.toml"), *sets],
                         capture_output=True, text=True, env=env, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]


@pytest.mark.slow  # 30-60 s on a 2-core AVX2 host
@pytest.mark.skipif(torch.cuda.is_available(), reason="auto picks the GPU here")
def test_device_cpu_trains_exactly_as_the_default(tmp_path):
    _run(tmp_path / "default")
    _run(tmp_path / "cpu", 'policy.device="cpu"')
    for stage in ("sft", "rl"):
        a = load_file(tmp_path / "default" / "policy" / stage / "model.safetensors")
        b = load_file(tmp_path / "cpu" / "policy" / stage / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
