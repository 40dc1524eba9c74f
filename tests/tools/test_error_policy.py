"""rl.error_policy: episodes that ended on an env error or a context overflow are dropped or scored 0, and counted.

A real broken env (tests/e2e/broken_env.py:Flaky, FrozenLake that raises or overflows by seed)
runs through ``arborl train``; the trained-token counter says which episodes the update used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arborl.store import open_store
from arborl.train.batch import step_batch
from arborl.trajectory.schema import Episode, Turn, new_id

ROOT = Path(__file__).resolve().parents[2]
TINY = ["env.cls=\"tests.e2e.broken_env:Flaky\"", "rollout.max_context_tokens=160", "rollout.max_turns=6",
        "synth.episodes=30", "sft.steps=4", "sft.batch_size=8", "sft.eval_every=0", "rl.iterations=2",
        "rl.tasks_per_iter=6", "rl.group_size=2", "rl.branch=false", "rl.credit=\"grpo\"", "rl.eval_every=0",
        "rl.drop_zero_advantage=false", "rl.checkpoint_every=0", "eval.episodes=4", "eval.probe_episodes=2",
        "policy.tokenizer_episodes=20", "report_to=[]", 'stages=["synth", "sft", "rl"]']


def _train(run: Path, policy: str) -> tuple[list[dict], list[Episode]]:
    args = [sys.executable, "-m", "arborl.cli", "train", "examples/tiny.toml", "--set", f'run_dir="{run}"']
    for kv in [*TINY, f'rl.error_policy="{policy}"']:
        args += ["--set", kv]
    p = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ARBORL_PROGRESS": "0", "HOME": "/tmp"})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["stage"] == "rl"]
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        eps = list(store.iter_episodes(source="rl"))
    return rows, eps


def _tokens(eps: list[Episode]) -> int:
    return sum(sum(t.output_mask) for e in eps for t in e.path())


@pytest.mark.parametrize("policy", ["drop", "zero"])
def test_failed_episodes_are_counted_and_dropped_or_trained_with_score_zero(tmp_path, policy):
    rows, eps = _train(tmp_path / policy, policy)
    errors = [e for e in eps if e.stop_reason == "env_error"]
    overflows = [e for e in eps if e.stop_reason == "max_context"]
    assert errors and overflows and len(errors) + len(overflows) < len(eps)
    assert all("ConnectionError: backend of seed" in e.turns[0].error for e in errors)
    for it, row in enumerate(rows):
        assert row["train/env_errors"] == sum(e.iteration == it for e in errors)
        assert row["train/max_context"] == sum(e.iteration == it for e in overflows)
    # every episode with a non-zero advantage is trained on (drop_zero_advantage is off), so the trained
    # tokens are those of all episodes (zero) or of the episodes that did not fail (drop)
    used = [e for e in eps if e.stop_reason not in ("env_error", "max_context")] if policy == "drop" else eps
    assert rows[-1]["tokens"] == _tokens(used)
    assert _tokens(errors + overflows) > 0  # so the two policies are told apart


def _episode(group: str, success: float | None, rewards: list[float], valid: list[bool], stop: str) -> Episode:
    ep = Episode(task_id="t", task_type="x", group_id=group, stop_reason=stop, rewards={"success": success})
    parent = None
    for k, (r, v) in enumerate(zip(rewards, valid, strict=True)):
        t = Turn(turn_id=new_id(), parent_id=parent, index=k, observation="o", prompt_ids=[1], output_ids=[2],
                 output_logprobs=[0.0], output_mask=[1], reward=r, valid=v)
        ep.add_turn(t)
        parent = t.turn_id
    return ep


def test_zero_scores_a_failed_episode_0_and_its_step_rewards_0():
    eps = [_episode("g", 1.0, [0.5, 1.0], [True, True], "terminated"),
           _episode("g", 1.0, [0.5, 0.25], [False, True], "env_error"),  # success 1 + penalty -1, rewards .5 .25
           _episode("g", None, [0.1], [True], "max_context")]
    plain = step_batch(eps, invalid_penalty=-1.0)
    assert plain.score.tolist() == [1.0, 0.0, 0.0] and plain.reward.tolist() == pytest.approx([0.5, 1.0, 0.5, 0.25, 0.1])
    zeroed = step_batch(eps, invalid_penalty=-1.0, zero=[False, True, True])
    assert zeroed.score.tolist() == [1.0, 0.0, 0.0] and zeroed.reward.tolist() == [0.5, 1.0, 0.0, 0.0, 0.0]
    high = step_batch(eps[1:2], invalid_penalty=0.0, zero=[True])
    assert step_batch(eps[1:2]).score.tolist() == [1.0] and high.score.tolist() == [0.0]
