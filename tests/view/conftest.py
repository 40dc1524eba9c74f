"""Fixtures of the viewer tests: the hand-built store of viewkit.py, a run directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from viewkit import build_episodes  # noqa: E402

from arborl.store import open_store  # noqa: E402


@pytest.fixture(scope="session")
def view_store(tmp_path_factory) -> str:
    """URL of a SQLite store holding :func:`build_episodes`' episodes (built once per session)."""
    d = tmp_path_factory.mktemp("view")
    url = f"sqlite:///{d}/traj.db"
    with open_store(url) as store:
        build_episodes(store)
    return url


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory) -> Path:
    """A run directory with a hand-written metrics.jsonl (the last line torn, as while a run writes)."""
    d = tmp_path_factory.mktemp("run")
    (d / "metrics.jsonl").write_text(
        '{"stage": "sft", "step": 1, "env_steps": 10, "success": 0.25, "reward": 0.5}\n'
        '{"stage": "rl", "step": 1, "env_steps": 30, "loss/policy": -0.1}\n'
        '{"stage": "rl", "step": 2, "env_steps": 50, "success": 0.75, "reward": 1.5}\n'
        '{"stage": "rl", "st')
    (d / "summary.json").write_text('{"sft": {"success": 0.25}, "rl": {"success": 0.75}, "rl_gain": 0.5}')
    return d
