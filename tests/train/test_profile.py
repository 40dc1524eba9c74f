"""The per-phase RL profile: timer arithmetic, the run summary, and what a real run logs."""

from __future__ import annotations

import time

import pytest

from arborl.train.profile import PHASES, PhaseTimer, profile_lines, profile_summary


def test_a_phase_entered_twice_adds_up_and_the_iteration_covers_every_phase():
    phase = PhaseTimer()
    with phase("rollout"):
        time.sleep(0.02)
    with phase("update"):
        time.sleep(0.03)
    with phase("rollout"):
        time.sleep(0.02)
    row = phase.row()
    assert set(row) == {f"time/{k}" for k in PHASES} | {"time/iteration"}
    assert 0.04 <= row["time/rollout"] < 0.2 and 0.03 <= row["time/update"] < 0.2
    assert row["time/branch"] == 0.0
    assert row["time/iteration"] >= row["time/rollout"] + row["time/update"]


def test_an_exception_inside_a_phase_is_still_timed_and_an_unknown_phase_is_refused():
    phase = PhaseTimer()
    with pytest.raises(KeyError), phase("store"):
        time.sleep(0.01)
        raise KeyError("boom")
    assert phase.seconds["store"] >= 0.01
    with pytest.raises(ValueError, match="unknown phase 'rolout'"), phase("rolout"):
        pass


def test_summary_means_and_shares_by_hand():
    rows = [
        {"time/rollout": 1.0, "time/update": 2.0, "time/iteration": 4.0},
        {"time/rollout": 3.0, "time/update": 2.0, "time/eval": 1.0, "time/iteration": 8.0},
        {"step": 3},  # an untimed row (e.g. from an older run) is ignored
    ]
    p = profile_summary(rows)
    assert p["iterations"] == 2 and p["iteration_s"] == 6.0
    assert p["phases"]["rollout"] == {"s": 2.0, "share": pytest.approx(1 / 3)}
    assert p["phases"]["update"] == {"s": 2.0, "share": pytest.approx(1 / 3)}
    assert p["phases"]["eval"] == {"s": 0.5, "share": pytest.approx(0.5 / 6)}
    assert p["phases"]["other"]["s"] == pytest.approx(1.5)  # 6 - (2 + 2 + 0.5)
    assert sum(v["share"] for v in p["phases"].values()) == pytest.approx(1.0)
    lines = dict(profile_lines(p))
    assert lines["RL iteration (mean)"] == "6.00 s" and lines["  rollout"] == "2.000 s (33%)"
    assert profile_summary([{"step": 1}]) == {} and profile_lines({}) == []


def test_torch_threads_sets_the_block_and_restores_even_on_error():
    import torch

    from arborl.train.profile import torch_threads

    before = torch.get_num_threads()
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with torch_threads(0):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(3):
        raise RuntimeError("x")
    assert torch.get_num_threads() == before


def test_update_threads_is_checked():
    from arborl.train.config import RLConfig

    with pytest.raises(ValueError, match="rl.update_threads must be >= 0"):
        RLConfig(update_threads=-1)
    assert RLConfig().update_threads == 0 and RLConfig().async_store
