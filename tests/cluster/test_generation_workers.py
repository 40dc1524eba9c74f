"""Generation workers: ``arborl serve`` servers in Ray actors on the two nodes, used as ``policy.urls``.

Greedy episodes generated through the workers equal the in-process ones token for token, and a
weight sync reaches every worker (its reported policy version and the turns it samples).
"""

from __future__ import annotations

import httpx
import pytest
import torch
from conftest import KWARGS, tiny_checkpoints

from arborl.cluster import start_generation_workers
from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.rollout.http_policy import HTTPPolicy

CFG = RolloutConfig(max_turns=4, batch_size=4, sampling=SamplingConfig(greedy=True, max_new_tokens=4))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("gen"), (0, 1))


def rollout(policy):
    specs = [EpisodeSpec(task_id=f"t{i}", task_type="frozenlake", group_id="g", seed=i) for i in range(6)]
    return run_episodes(policy, lambda: FrozenLake(**KWARGS), specs, CFG, generator=torch.Generator().manual_seed(0))


def test_generation_workers_serve_the_policy_on_the_nodes(ray_driver, checkpoints):
    from arborl.policy import load_policy

    model, tok = load_policy(checkpoints[0])
    renderer = ChatRenderer(tok, None)
    actors, urls = start_generation_workers(ray_driver, str(checkpoints[0]), 2, cpus=0.25, device="cpu")
    try:
        assert len(set(urls)) == 2
        policy = HTTPPolicy(urls, renderer)
        local, remote = rollout(ModelPolicy(model, renderer)), rollout(policy)
        assert [[t.output_ids for t in e.turns] for e in remote] == [[t.output_ids for t in e.turns] for e in local]
        policy.sync(str(checkpoints[1]), 7)
        assert [httpx.get(f"{u}/health", timeout=30).json()["policy_version"] for u in urls] == [7, 7]
        assert {t.policy_version for e in rollout(policy) for t in e.turns} == {7}
        policy.close()
    finally:
        for a in actors:
            ray_driver.kill(a)
