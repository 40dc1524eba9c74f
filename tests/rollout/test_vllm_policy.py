"""The in-process vLLM backend without vLLM: config rules, the missing-package error, request and output shapes."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from arborl.config import ConfigError, load_config
from arborl.rollout.config import SamplingConfig
from arborl.rollout.vllm_policy import (
    MISSING,
    Completion,
    VLLMPolicy,
    close_turn,
    read_completion,
    sampling_kwargs,
)
from arborl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_sampling_kwargs_ask_for_the_sampled_tokens_log_prob_only():
    kw = sampling_kwargs(SamplingConfig(temperature=0.7, top_p=0.9), max_new_tokens=5, stop_ids=[7], seed=11)
    assert kw == {"n": 1, "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "seed": 11, "logprobs": 0,
                  "stop_token_ids": [7], "skip_special_tokens": False}
    assert sampling_kwargs(SamplingConfig(greedy=True), max_new_tokens=1, stop_ids=[7], seed=0)["temperature"] == 0.0


def _output(ids, lps, finish):
    """The fields of vLLM's ``CompletionOutput`` the reader uses: one ``{token_id: Logprob}`` per token."""
    return SimpleNamespace(token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps, strict=True)],
                           finish_reason=finish)


def test_read_completion_takes_each_sampled_tokens_log_prob():
    got = read_completion(_output([4, 9, 7], [-0.5, -1.25, -0.1], "stop"), [7])
    assert (got.ids, got.logprobs, got.stopped) == ([4, 9, 7], [-0.5, -1.25, -0.1], True)
    cut = read_completion(_output([4, 9], [-0.5, -1.25], "length"), [7])
    assert not cut.stopped
    with pytest.raises(ValueError, match="logprobs=0"):
        read_completion(SimpleNamespace(token_ids=[4], logprobs=None, finish_reason="stop"), [7])


def test_a_turn_cut_at_the_budget_is_closed_with_a_forced_end_token():
    out = close_turn(Completion([4, 9], [-0.5, -1.0], stopped=False), end_id=7)
    assert (out.ids, out.logprobs, out.mask) == ([4, 9, 7], [-0.5, -1.0, 0.0], [1, 1, 0])
    done = close_turn(Completion([4, 7], [-0.5, -0.2], stopped=True), end_id=7)
    assert (done.ids, done.mask) == ([4, 7], [1, 1])


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_backend_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="needs vLLM, which is not installed"):
        VLLMPolicy(tmp_path, renderer=None)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sets = ['policy.backend="vllm"', "rl.branch=false", 'rl.credit="grpo"', f'run_dir="{tmp_path / "run"}"']
    got = subprocess.run([sys.executable, "-m", "arborl.cli", "train", str(ROOT / "examples" / "tiny.toml"),
                          *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, env=env, timeout=600)
    assert got.returncode == 2
    last = got.stderr.strip().splitlines()[-1]
    assert last.startswith("arborl: error: ") and last.endswith(MISSING)
    assert not (tmp_path / "run").exists()  # refused before any stage ran


@pytest.mark.skipif(not HAS_VLLM, reason="the missing package is refused first")
def test_vllm_backend_refuses_branches():
    with pytest.raises(ConfigError, match='rl.branch = true needs policy.backend = "local" \\(not "vllm"\\)'):
        load_config(TrainConfig, ROOT / "examples" / "tiny.toml", ['policy.backend="vllm"'])


def test_vllm_memory_share_is_checked():
    with pytest.raises(ConfigError, match="vllm_gpu_memory_utilization"):
        load_config(TrainConfig, None, ["policy.vllm_gpu_memory_utilization=1.5"])
