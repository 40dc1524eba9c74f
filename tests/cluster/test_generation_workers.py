"""Generation workers: ``arborl serve`` servers in Ray actors on the two nodes, used as ``policy.urls``.

Greedy episodes generated through the workers equal the in-process ones token for token, and a
weight sync reaches every worker (its reported policy version and the turns it samples).
"""

from __future__ import annotations

import httpx
import pytest
import torch

from arborl.cluster import start_generation_workers
from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, ModelConfig, build_model, save_policy, train_tokenizer
from arborl.rollout import EpisodeSpec, ModelPolicy, RolloutConfig, SamplingConfig, run_episodes
from arborl.rollout.http_policy import HTTPPolicy

KWARGS = {"size": 4, "obs_format": "rows+cols"}
TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                   max_position_embeddings=512)
CFG = RolloutConfig(max_turns=4, batch_size=4, sampling=SamplingConfig(greedy=True, max_new_tokens=4))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    env, corpus = FrozenLake(**KWARGS), list(FrozenLake.actions)
    for seed in range(10):
        corpus.append(env.format_observation(env.reset(seed=seed)[0]))
    tok = train_tokenizer(corpus)
    root = tmp_path_factory.mktemp("gen")
    return [save_policy(build_model(TINY, tok, seed=s), tok, root / f"m{s}") for s in (0, 1)]


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
