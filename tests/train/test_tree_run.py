"""Tree rollouts through the real CLI (examples/tiny.toml): what a run counts as its env steps."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl  # noqa: E402

from arborl.store import open_store  # noqa: E402


def test_tree_continuations_count_their_own_turns_and_the_replayed_prefix_apart(tmp_path):
    run = tmp_path / "run"
    # one continuation per picked turn, so no two continuations can share their content (the store
    # keeps one of equal contents) and the store's records account for every one of them
    arborl("train", "examples/tiny.toml", "--set", f'run_dir="{run}"', "--set", "rl.credit=tree",
           "--set", "rl.branch=false", "--set", "rl.tree=true", "--set", "rl.tree_k=1", "--set", "rl.tree_nodes=2",
           "--set", "report_to=[]")
    rows = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["stage"] == "rl"]
    summary = json.loads((run / "summary.json").read_text())
    with open_store(f"sqlite:///{run}/trajectories.db", read_only=True) as store:
        tree = list(store.iter_rows(source="rl-tree"))
        sampled = list(store.iter_rows(source="rl"))
    assert len(tree) == 2 * 2 * 2  # 2 iterations x 2 tasks x 2 picked turns, one continuation each
    # a continuation's record keeps its own turns (n_nodes); it reads back with its trunk's prefix (n_turns)
    replayed = sum(r.n_turns - r.n_nodes for r in tree)
    assert rows[-1]["replayed_steps"] == replayed > 0
    # env steps of RL: every sampled turn (group members that came out equal are one record, so the
    # records give a lower bound) and each continuation's own turns, not its re-played prefix
    rl_steps = rows[-1]["env_steps"] - summary["demo_turns"]
    own = sum(r.n_nodes for r in tree)
    assert sum(r.n_turns for r in sampled) + own <= rl_steps <= 2 * 2 * 3 * 10 + own  # at most max_turns a member
