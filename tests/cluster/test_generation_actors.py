"""Generation actors (``cluster.generation = "actor"``) on the two-node loopback cluster.

The actors hold copies of the policy; the driver pushes weights through the object store and
splits each iteration's groups over them. Checked here: after an update every actor holds the
driver's weights bit for bit and samples with them (the turns record the version, and the
rollout log-probs equal the trainer's recomputed ones); a killed actor is restarted and its
share rolled out again into the very episodes an undisturbed run gets.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import KWARGS, tiny_checkpoints

from arborl.config import load_config
from arborl.env.envs import FrozenLake
from arborl.policy import load_policy, token_logprobs
from arborl.train.batch import collate
from arborl.train.config import TrainConfig


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("gen"), (0,))[0]


def config(tmp_path, address: str, *, workers: int = 2, staleness: int = 0, env: str = "arborl.env.envs:FrozenLake",
           kwargs: dict | None = None) -> TrainConfig:
    kw = ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in {**KWARGS, **(kwargs or {})}.items())
    return load_config(TrainConfig, "examples/frozenlake.toml", [
        f'run_dir="{tmp_path}"', f'cluster.address="{address}"', 'cluster.generation="actor"',
        f"cluster.generation_workers={workers}", "cluster.generation_worker_cpus=0.25", "rl.tasks_per_iter=4",
        "rl.group_size=2", f"rl.max_staleness={staleness}", f'env.cls="{env}"', f"env.kwargs={{ {kw} }}",
        "rollout.max_turns=4"])


def pool(cfg, start, *, stop: int = 3):
    from arborl.cluster.rollouts import ActorRollouts

    model, _ = load_policy(start)
    gen, task_gen = torch.Generator().manual_seed(2), torch.Generator().manual_seed(3)
    return model, gen, ActorRollouts(cfg, model, start, list(FrozenLake.actions), "frozenlake", start=0, stop=stop,
                                     gen=gen, task_gen=task_gen)


def view(ro) -> list:
    return [(e.group_id, e.seed, e.stop_reason,
             [(t.observation, t.output_ids, t.output_logprobs, t.reward, t.policy_version) for t in e.turns]) for e in ro.episodes]


@pytest.mark.slow  # 35 s plus the cluster's start on a 2-core AVX2 host
def test_an_update_reaches_every_actor_and_samples_the_next_batch(ray_driver, ray_cluster, start, tmp_path):
    from arborl.train.async_rollout import plain_state

    model, _, actors = pool(config(tmp_path, ray_cluster.address), start)
    with actors:
        first = actors.take(0)
        assert {t.policy_version for e in first.episodes for t in e.turns} == {0}
        assert first.n_sampled == 8 and len({e.group_id for e in first.episodes[:8]}) == 4
        with torch.no_grad():  # an update: every weight moves
            g = torch.Generator().manual_seed(9)
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        actors.publish(1, model)
        second = actors.take(1)
        want = plain_state(model)
        for actor in actors.actors:
            version, weights = ray_driver.get(actor.weights.remote())
            assert version == 1 and weights.keys() == want.keys()
            assert all(torch.equal(weights[k], want[k]) for k in want)
    assert {t.policy_version for e in second.episodes for t in e.turns} == {1}
    # the behaviour log-probs the actors recorded are the trainer's log-probs under the pushed weights
    sampled = [e for e in second.episodes[: second.n_sampled]]
    batch = collate(sampled, pad_id=0)
    with torch.no_grad():
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask)
    mask = batch.loss_mask.bool()
    assert mask.sum() > 20
    assert torch.allclose(logp[mask], batch.old_logp[mask], atol=1e-5), (logp[mask] - batch.old_logp[mask]).abs().max()


@pytest.mark.slow  # 30-60 s on a 2-core AVX2 host
def test_a_killed_actor_is_restarted_and_its_share_gives_the_same_episodes(ray_driver, ray_cluster, start, tmp_path):
    address = ray_cluster.address
    flag = tmp_path / "die"
    dying = {"env": "dying_env:DyingLake", "kwargs": {"flag": str(flag), "die_at": 6}}
    _, _, calm = pool(config(tmp_path / "calm", address, **dying), start, stop=1)
    with calm:
        want = calm.take(0)
    assert calm.retries == 0
    flag.write_text("")
    _, _, hit = pool(config(tmp_path / "hit", address, **dying), start, stop=1)
    with hit:
        got = hit.take(0)
    assert not flag.exists() and hit.retries == 1  # one actor died at its 6th step and was restarted
    assert view(got) == view(want)


@pytest.mark.slow  # 30-60 s on a 2-core AVX2 host
def test_sampling_ahead_on_the_actors_uses_the_scheduled_versions(ray_driver, ray_cluster, start, tmp_path):
    model, _, actors = pool(config(tmp_path, ray_cluster.address, staleness=1), start)
    with actors:
        assert sorted(actors._pending) == [0, 1]  # both batches of version 0 are being sampled at once
        versions = []
        for it in range(3):
            ro = actors.take(it)
            versions.append({t.policy_version for e in ro.episodes for t in e.turns})
            actors.publish(it + 1, model)
    assert versions == [{0}, {0}, {1}]


def test_an_actor_that_dies_past_the_retry_budget_stops_the_run_with_the_setting_named(ray_driver, ray_cluster, start,
                                                                                       tmp_path):
    flag = tmp_path / "die"
    flag.write_text("")
    cfg = config(tmp_path, ray_cluster.address, workers=1, env="dying_env:DyingLake",
                 kwargs={"flag": str(flag), "die_at": 3})
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, max_generation_retries=0))
    _, _, actors = pool(cfg, start, stop=1)
    with actors, pytest.raises(RuntimeError, match=r"died 1 time rolling out iteration 0 \(cluster.max_generation_retries = 0;"):
        actors.take(0)
