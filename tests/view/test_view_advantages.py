"""The advantages a real run gave each turn reach the explorer: run_dir/advantages.jsonl, by turn id."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from clikit import arborl, sets
from fastapi.testclient import TestClient

from arborl.store import open_store
from arborl.view.api import create_app


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("adv") / "run"
    arborl("train", "examples/frozenlake.toml", *sets(run, ["rl.credit=\"grpo\"", "rl.branch=false",
                                                            "rl.singleton=\"zero\""]))
    return run


def test_each_iteration_records_grpo_advantages_that_are_one_per_episode_and_centred(grpo_run):
    lines = [json.loads(x) for x in (grpo_run / "advantages.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [0, 1] and {x["credit"] for x in lines} == {"grpo"}
    with open_store(f"sqlite:///{grpo_run}/trajectories.db", read_only=True) as store:
        rl = [store.get(r.episode_id) for r in store.iter_rows(source="rl")]
    for line in lines:
        by_group = defaultdict(list)
        for ep in (e for e in rl if e.iteration == line["iteration"]):
            got = {line["turns"].get(t.turn_id) for t in ep.path()}
            assert len(got) == 1  # GRPO: every turn of an episode gets the episode's advantage
            (a,) = got
            if a is not None:
                by_group[ep.group_id].append(a)
        for advs in by_group.values():  # centred on the group mean (whitened by its std, or all 0)
            assert abs(sum(advs)) < 1e-4 * len(advs)


def test_the_episode_api_shows_the_runs_advantage_on_each_turn(grpo_run):
    url = f"sqlite:///{grpo_run}/trajectories.db"
    line = json.loads((grpo_run / "advantages.jsonl").read_text().splitlines()[-1])
    with open_store(url, read_only=True) as store:
        ep = next(store.get(r.episode_id) for r in store.iter_rows(source="rl", iteration=1))
    with TestClient(create_app(url, [grpo_run])) as c:
        turns = c.get(f"/api/episodes/{ep.episode_id}").json()["turns"]
    for t in turns:
        want = line["turns"].get(t["turn_id"])
        assert t["advantages"] == ({} if want is None else {"grpo": pytest.approx(want)})
    with TestClient(create_app(url)) as c:  # without --run: nothing to show
        assert all(t["advantages"] == {} for t in c.get(f"/api/episodes/{ep.episode_id}").json()["turns"])
