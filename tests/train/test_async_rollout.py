"""Asynchronous rollouts: the version protocol of the rollout worker, and staleness through the real CLI."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from arborl.config import load_config
from arborl.store import open_store
from arborl.train.async_rollout import Rollout, RolloutWorker, sampling_version
from arborl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_sampling_version_lags_by_at_most_k():
    assert [sampling_version(i, 0, 1) for i in range(5)] == [0, 0, 1, 2, 3]
    assert [sampling_version(i, 3, 2) for i in range(3, 8)] == [3, 3, 3, 4, 5]
    for k in (1, 2, 3):
        assert all(0 <= i - sampling_version(i, 0, k) <= k for i in range(20))


@pytest.mark.parametrize("k", [1, 2])
def test_worker_samples_each_batch_with_the_weights_of_its_version(k):
    """The trainer's loop in miniature: take batch i, 'update' (weight += 1), publish version i + 1."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)  # version v has weight v
    seen = []

    def sample(it, m, version):
        seen.append(threading.current_thread().name)
        return Rollout([], 0, version, {"w": float(m.weight)})

    with RolloutWorker(sample, model, start=0, stop=8, max_staleness=k) as worker:
        for it in range(8):
            ro = worker.take(it)
            assert ro.version == max(0, it - k)  # never more than k versions behind
            assert ro.seconds["w"] == float(ro.version)  # sampled by exactly that version's weights
            with torch.no_grad():
                model.weight.add_(1.0)
            worker.publish(it + 1, model)
    assert set(seen) == {"arborl-rollout"}  # sampled on the worker's thread, from its own copy
    assert float(model.weight.detach()) == 8.0


def test_worker_error_reaches_the_trainer():
    def sample(it, m, version):
        raise RuntimeError(f"env broke at {it}")

    with (RolloutWorker(sample, torch.nn.Linear(1, 1), start=0, stop=3, max_staleness=1) as worker,
          pytest.raises(RuntimeError, match="env broke at 0")):
        worker.take(0)


def test_max_staleness_is_checked():
    with pytest.raises(ValueError, match="max_staleness"):
        load_config(TrainConfig, ROOT / "examples" / "tiny.toml", ["rl.max_staleness=-1"])
    with pytest.raises(ValueError, match="behav_cap"):
        load_config(TrainConfig, ROOT / "examples" / "tiny.toml", ["rl.behav_cap=0.5"])


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    sets = [a for o in ("rl.iterations=3", "eval.episodes=4", "report_to=[]", f'run_dir="{run_dir}"', *overrides)
            for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "arborl.cli", "train", str(ROOT / "examples" / "tiny.toml"), *sets],
                          capture_output=True, text=True, env=env, timeout=600)


def _rl_turn_versions(run_dir: Path) -> list[tuple[int, int]]:
    store = open_store(f"sqlite:///{run_dir}/trajectories.db")
    return [(e.iteration, t.policy_version) for e in store.iter_episodes(source="rl") for t in e.path()]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_staleness_1_cli_run_trains_on_batches_at_most_one_version_old(tmp_path, worker):
    got = _train(tmp_path / "s1", "rl.max_staleness=1", f'rl.rollout_worker="{worker}"')
    assert got.returncode == 0, got.stderr[-2000:]
    pairs = _rl_turn_versions(tmp_path / "s1")
    lags = {it - v for it, v in pairs}
    assert lags == {0, 1}  # iteration 0 is fresh, every later batch one version old: never more
    rows = [json.loads(line) for line in (tmp_path / "s1" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl"]
    assert [r["train/staleness"] for r in rl] == [0.0, 1.0, 1.0]
    assert all(r["train/staleness_max"] <= 1 for r in rl)
    stale = [r for r in rl if r["train/staleness"] == 1]
    assert all("diag/behav_weight_mean" in r for r in stale)  # the decoupled correction ran


def test_staleness_0_is_the_synchronous_run(tmp_path):
    """``max_staleness = 0`` takes the synchronous path: every batch sampled by the weights it trains."""
    got = _train(tmp_path / "s0", "rl.max_staleness=0")
    assert got.returncode == 0, got.stderr[-2000:]
    pairs = _rl_turn_versions(tmp_path / "s0")
    assert pairs and all(it == v for it, v in pairs)
    rows = [json.loads(line) for line in (tmp_path / "s0" / "metrics.jsonl").read_text().splitlines()]
    assert not any("diag/behav_weight_mean" in r or "time/rollout_worker" in r for r in rows)
