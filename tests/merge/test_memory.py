"""Peak memory of a merge stays near the largest tensor, not the model (measured in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from arborl.merge import NEEDS_BASE
from tests.e2e.clikit import ROOT, cli_env

MB = 1 << 20
LARGEST = 16 * MB
CONSTANT = 24 * MB
"""Allowance for the merge's own bookkeeping beside the tensors (headers, a numpy view, allocator slack)."""

MEASURE = r"""
import json, resource, sys
import torch
from arborl.merge import MergeConfig
from arborl.merge.checkpoint import merge_checkpoints

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

cfg = MergeConfig(**json.loads(sys.argv[1]))
with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to the current RSS
    f.write("5")
before = rss("VmRSS:")
merge_checkpoints(cfg, sys.argv[2])
print(json.dumps({"before": before, "peak": rss("VmHWM:")}))
"""


def fake_checkpoint(path: Path, seed: int) -> Path:
    """~100 MB of float32 tensors: one of 16 MB, nine of ~9.3 MB (config.json is all a merge reads besides)."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"embed.weight": torch.randn(LARGEST // 4, generator=gen).view(4096, -1)}
    tensors.update({f"layers.{i}.weight": torch.randn(2_450_000, generator=gen).view(1000, -1) for i in range(9)})
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("mem")
    return [fake_checkpoint(root / name, seed) for seed, name in enumerate(("a", "b", "base"))]


def peak_growth(cfg: dict, out: Path) -> int:
    p = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(cfg), str(out)], capture_output=True, text=True,
                       env=cli_env(), cwd=ROOT, timeout=300, check=True)
    m = json.loads(p.stdout.strip().splitlines()[-1])
    return m["peak"] - m["before"]


@pytest.mark.parametrize("method", ["linear", "slerp", "task_arithmetic", "ties", "dare"])
def test_two_model_merge_peak_is_under_two_largest_tensors(checkpoints, tmp_path, method):
    a, b, base = checkpoints
    total = sum(f.stat().st_size for f in (a / "model.safetensors", b / "model.safetensors"))
    assert total > 190 * MB
    cfg = {"method": method, "models": [str(a), str(b)], "base": str(base) if method in NEEDS_BASE else "",
           "density": 0.5}
    grew = peak_growth(cfg, tmp_path / "m")
    print(f"{method}: peak grew {grew / MB:.1f} MB")
    assert grew < 2 * LARGEST + CONSTANT, f"{method}: peak grew {grew / MB:.1f} MB"
