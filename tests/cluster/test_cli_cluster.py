"""The FrozenLake recipe through the real CLI on the two-node cluster equals the single-process run.

Same seed, tiny budget, 3 RL iterations: every stored episode (synth, RL, eval) has the same
content hash, task and iteration, and the final weights are equal bit for bit. The env steps of
the cluster run happen in the Ray actors (the stored episodes name the env class the workers ran).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import ray_env
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from clikit import arborl, sets  # noqa: E402

from arborl.store import open_store  # noqa: E402
from arborl.trajectory import content_hash  # noqa: E402

CFG = "examples/frozenlake.toml"
EXTRA = ["rl.iterations=3", "eval.episodes=8", 'report_to=[]']


def hashes(run: Path) -> list[tuple[str, int, str, str]]:
    """(source, iteration, task, content hash) of every stored episode, sorted.

    A continuation's hash covers its origin, which names its trunk by episode id (a fresh uuid in
    every run): it is hashed here with the trunk's content hash in that place. Sorted: the store
    lists episodes by creation time, which the engine's threads interleave.
    """
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        rows = list(store.iter_rows())
        episodes = {r.episode_id: store.get(r.episode_id) for r in rows}
    of = {r.episode_id: r.content_hash for r in rows}
    out = []
    for r in rows:
        ep = episodes[r.episode_id]
        h = r.content_hash if ep.origin is None else content_hash(replace(ep, origin=replace(ep.origin, of=of[ep.origin.of])))
        out.append((r.source, r.iteration, r.task_id, h))
    return sorted(out)


@pytest.mark.slow
def test_frozenlake_on_the_cluster_equals_the_single_process_run(tmp_path, ray_cluster):
    local, remote = tmp_path / "local", tmp_path / "cluster"
    arborl("train", CFG, *sets(local, EXTRA), env=ray_env())
    out = arborl("train", CFG, *sets(remote, [*EXTRA, f'cluster.address="{ray_cluster.address}"',
                                              "cluster.env_workers=2", "cluster.env_worker_cpus=0.5"]), env=ray_env())
    assert "env workers: 2 Ray actors on a cluster of 2 nodes" in out.stdout, out.stdout
    a, b = hashes(local), hashes(remote)
    assert len(a) > 60 and {s for s, *_ in a} >= {"synth", "rl"}
    assert a == b
    wa, wb = load_file(local / "policy" / "rl" / "model.safetensors"), load_file(remote / "policy" / "rl" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_bad_cluster_settings_are_refused_with_the_fix():
    from arborl.config import ConfigError, load_config
    from arborl.train.config import TrainConfig

    for sets_, says in [(['cluster.address="nowhere"'], "cluster.address = 'nowhere' is not an address"),
                        (["cluster.env_workers=0"], "cluster.env_workers = 0; use an integer >= 1"),
                        (["cluster.env_worker_cpus=-1"], "cluster.env_worker_cpus = -1"),
                        (["cluster.generation_workers=1"], "cluster.generation_workers needs a cluster"),
                        (['cluster.address="local"', "cluster.generation_workers=1"],
                         'cluster.generation_workers generates for policy.backend = "http"'),
                        (['cluster.address="local"', "rl.max_staleness=1", 'rl.rollout_worker="process"'],
                         'set rl.rollout_worker = "thread" with cluster.address, or cluster.generation = "actor"'),
                        (['cluster.generation="vllm"'], 'cluster.generation = \'vllm\'; use "http"'),
                        (['cluster.address="local"', 'cluster.generation="actor"'],
                         'cluster.generation = "actor" needs cluster.generation_workers >= 1'),
                        (['cluster.address="local"', 'cluster.generation="actor"', "cluster.generation_workers=1",
                          'policy.backend="http"', "rl.branch=false"],
                         'runs the in-process engine in Ray actors, not policy.backend = "http"; set policy.backend = "local"')]:
        with pytest.raises(ConfigError) as err:
            load_config(TrainConfig, CFG, sets_)
        assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_sampling_ahead_with_a_cluster_is_accepted_with_generation_actors():
    from arborl.config import load_config
    from arborl.train.config import TrainConfig

    cfg = load_config(TrainConfig, CFG, ['cluster.address="local"', "rl.max_staleness=1", 'rl.rollout_worker="process"',
                                         'cluster.generation="actor"', "cluster.generation_workers=2"])
    assert cfg.cluster.generation == "actor" and cfg.rl.max_staleness == 1


ACTORS = ['cluster.generation="actor"', "cluster.generation_worker_cpus=0.25", "cluster.env_workers=1",
          "cluster.env_worker_cpus=0.25"]


@pytest.mark.slow
def test_frozenlake_with_one_generation_actor_equals_the_single_process_run(tmp_path, ray_cluster):
    # one actor samples from the driver's stream and hands it back: the very run of one process
    local, remote = tmp_path / "local", tmp_path / "actor"
    arborl("train", CFG, *sets(local, EXTRA), env=ray_env())
    out = arborl("train", CFG, *sets(remote, [*EXTRA, f'cluster.address="{ray_cluster.address}"', *ACTORS,
                                              "cluster.generation_workers=1"]), env=ray_env())
    assert "generation actors: 1 Ray actor holding the policy" in out.stdout, out.stdout
    a, b = hashes(local), hashes(remote)
    assert len([r for r in a if r[0] == "rl"]) == 3 * 2 * 3 and {s for s, *_ in a} >= {"synth", "rl", "rl-branch"}
    assert a == b
    wa, wb = load_file(local / "policy" / "rl" / "model.safetensors"), load_file(remote / "policy" / "rl" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_generation_actors_sample_ahead_while_the_driver_updates(tmp_path, ray_cluster):
    run = tmp_path / "run"
    out = arborl("train", CFG, *sets(run, [*EXTRA, f'cluster.address="{ray_cluster.address}"', *ACTORS,
                                           "cluster.generation_workers=2", "rl.max_staleness=1",
                                           'rl.rollout_worker="process"']), env=ray_env())
    assert "generation actors: 2 Ray actors holding the policy, rolling out each iteration's groups ahead of the " \
           "update" in out.stdout, out.stdout
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        eps = list(store.iter_episodes(source="rl"))
    # iteration i is sampled by version max(0, i - 1), on both actors
    assert {(e.iteration, t.policy_version) for e in eps for t in e.turns} == {(0, 0), (1, 0), (2, 1)}
    assert (run / "policy" / "rl" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_killed_generation_actor_is_restarted_and_the_run_ends_as_undisturbed(tmp_path, ray_cluster):
    # the same run twice on two actors; in the second, one actor exits at its 40th env step
    flag, calm, hit = tmp_path / "die", tmp_path / "calm", tmp_path / "hit"
    kwargs = f'{{ size = 4, obs_format = "rows+cols", progress_reward = 0.1, flag = "{flag}", die_at = 40 }}'
    common = [*EXTRA, f'cluster.address="{ray_cluster.address}"', *ACTORS, "cluster.generation_workers=2",
              'env.cls="dying_env:DyingLake"', f"env.kwargs={kwargs}"]
    arborl("train", CFG, *sets(calm, common), env=ray_env())
    flag.write_text("")
    out = arborl("train", CFG, *sets(hit, common), env=ray_env())
    assert not flag.exists() and "died; its share of iteration" in out.stdout, out.stdout
    assert hashes(calm) == hashes(hit)
    wa, wb = load_file(calm / "policy" / "rl" / "model.safetensors"), load_file(hit / "policy" / "rl" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_bad_cluster_setting_is_one_line_from_the_cli():
    p = arborl("config", "show", CFG, "--set", 'cluster.address="nowhere"', check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert '"local", "auto", "HOST:PORT" or "ray://HOST:PORT"' in p.stderr


def test_without_ray_installed_the_error_names_the_extra(tmp_path):
    # a `ray` that cannot be imported, first on the path: what a machine without the extra sees
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**ray_env(), "PYTHONPATH": f"{tmp_path}:{ray_env()['PYTHONPATH']}"}
    p = arborl("train", CFG, *sets(tmp_path / "run", ['cluster.address="local"']), check=False, env=env)
    assert p.returncode == 2, p.stderr
    assert "pip install 'arborl[ray]'" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "run").exists()  # refused before the run directory is touched


def test_no_cluster_never_imports_ray():
    code = ("import sys; from arborl.cluster import ClusterConfig, cluster_envs; "
            "from arborl.config import load_config; from arborl.train.config import TrainConfig; "
            "from arborl.train.common import env_factory; cfg = load_config(TrainConfig, 'examples/frozenlake.toml'); "
            "ctx = cluster_envs(cfg.cluster, cfg.env, env_factory(cfg.env)); make = ctx.__enter__(); "
            "env = make(); env.reset(seed=0); ctx.__exit__(None, None, None); "
            "assert type(env).__name__ == 'FrozenLake'; print('ray' in sys.modules)")
    import subprocess

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=ray_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


@pytest.mark.slow
def test_local_address_starts_ray_for_the_run(tmp_path):
    local, started = tmp_path / "local", tmp_path / "started"
    synth = ['stages=["synth"]', "synth.episodes=24"]
    arborl("train", CFG, *sets(local, synth), env=ray_env())
    out = arborl("train", CFG, *sets(started, [*synth, 'cluster.address="local"', "cluster.local_cpus=1",
                                               "cluster.env_worker_cpus=0.5"]), env=ray_env())
    assert "env workers: 2 Ray actors on a cluster of 1 node" in out.stdout, out.stdout
    assert hashes(local) == hashes(started) and len(hashes(local)) == 24


@pytest.mark.slow
def test_rl_generates_on_generation_workers_of_the_cluster(tmp_path, ray_cluster):
    run = tmp_path / "run"
    arborl("train", CFG, *sets(run, ['stages=["synth","sft"]']), env=ray_env())
    extra = ['stages=["rl"]', 'policy.backend="http"', "rl.branch=false", f'cluster.address="{ray_cluster.address}"',
             "cluster.generation_workers=2", "cluster.generation_worker_cpus=0.25", "cluster.env_worker_cpus=0.25"]
    out = arborl("rl", CFG, *sets(run, extra), env=ray_env())
    assert "generation workers: 2 arborl serve actors at http://" in out.stdout, out.stdout
    with open_store(f"sqlite:///{run}/trajectories.db") as store:
        eps = list(store.iter_episodes(source="rl"))
    # every iteration generated with the weights it pushed to the workers first
    assert {(e.iteration, t.policy_version) for e in eps for t in e.turns} == {(0, 0), (1, 1)}
    assert all(e.stop_reason != "env_error" for e in eps)
