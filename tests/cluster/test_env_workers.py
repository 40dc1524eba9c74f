"""Env worker actors on a real two-node Ray cluster: the rollout engine's envs live in actors.

The attack: a worker process is SIGKILLed while its episodes are mid-rollout. Ray restarts it,
each of its episodes is rebuilt there from seed and actions and goes on; the batch finishes with
the very episodes a single-process rollout gives, and the retried ones say so in their turn info.
"""

from __future__ import annotations

import os
import signal
import zlib

import pytest

from arborl.cluster import ClusterConfig, start_env_workers
from arborl.env import check_env
from arborl.env.envs import FrozenLake
from arborl.policy import ChatRenderer, train_tokenizer
from arborl.rollout import EpisodeSpec, RolloutConfig, ScriptedPolicy, run_episodes

ACTIONS = ["Left", "Down", "Right", "Up", "Jump"]  # "Jump" is not an action: an invalid turn
KWARGS = {"size": 4, "obs_format": "rows+cols"}
CFG = RolloutConfig(max_turns=8, batch_size=6, env_workers=6, env_timeout_s=120.0)


def workers_of(ray, n: int, *, retries: int = 3, cls: str = "arborl.env.envs:FrozenLake", kwargs=None):
    class Spec:  # what start_env_workers reads of the [env] section
        pass

    spec = Spec()
    spec.cls, spec.kwargs = cls, KWARGS if kwargs is None else kwargs
    cfg = ClusterConfig(address="auto", env_workers=n, env_worker_cpus=0.25, max_env_retries=retries)
    return start_env_workers(ray, cfg, spec)


def act(env) -> str:
    """A deterministic policy of the state: the same states give the same actions on any worker."""
    return ACTIONS[zlib.crc32(repr(env.state_key()).encode()) % len(ACTIONS)]


@pytest.fixture(scope="module")
def renderer():
    env, corpus = FrozenLake(**KWARGS), list(ACTIONS)
    for seed in range(20):
        corpus.append(env.format_observation(env.reset(seed=seed)[0]))
    return ChatRenderer(train_tokenizer(corpus), None)


def specs(n: int) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"t{i}", task_type="frozenlake", group_id=f"g{i}", seed=100 + i) for i in range(n)]


def view(ep, drop=("env_worker_retries",)):
    """What an episode is, without ids and timings (and without the retry note)."""
    turns = [(t.observation, t.action_text, t.reward, t.result, t.valid, t.terminated, t.truncated, t.state_key,
              {k: v for k, v in t.info.items() if k not in drop}, t.prompt_ids, t.output_ids) for t in ep.turns]
    return ep.stop_reason, ep.rewards, ep.metadata.get("env"), turns


def retries_of(ep) -> int:
    return max((t.info.get("env_worker_retries", 0) for t in ep.turns), default=0)


def local_run(renderer, n):
    return run_episodes(ScriptedPolicy(act, renderer), lambda: FrozenLake(**KWARGS), specs(n), CFG,
                        generator=__import__("torch").Generator().manual_seed(0))


def killing(ray, workers, after_calls: int):
    """``act``, that SIGKILLs worker 0's process on its ``after_calls``-th call (mid-rollout)."""
    pid, calls = ray.get(workers.actors[0].pid.remote()), [0]

    def fn(env):
        calls[0] += 1
        if calls[0] == after_calls:
            os.kill(pid, signal.SIGKILL)
        return act(env)

    return fn, pid


def test_remote_env_passes_check_env(ray_driver):
    workers = workers_of(ray_driver, 1)
    env = workers.make()
    assert env.remote_class_name == "FrozenLake" and env.task_type == "frozenlake"
    assert list(env.actions) == list(FrozenLake.actions)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = env.nope
    check_env(env)


def test_killed_worker_is_restarted_and_its_episodes_retried(ray_driver, renderer):
    n = 12
    expected = local_run(renderer, n)
    assert sum(len(e.turns) for e in expected) > 3 * n  # long enough that the kill lands mid-episode
    workers = workers_of(ray_driver, 2)
    fn, pid = killing(ray_driver, workers, after_calls=15)
    got = run_episodes(ScriptedPolicy(fn, renderer), workers.make, specs(n), CFG,
                       generator=__import__("torch").Generator().manual_seed(0))
    assert [view(e) for e in got] == [view(e) for e in expected]
    assert all(e.stop_reason != "env_error" for e in got)
    retried = [e for e in got if retries_of(e)]
    # three of the six live envs were on the killed worker (round robin), each retried once
    assert len(retried) == 3 and workers.retries == 3
    assert ray_driver.get(workers.actors[0].pid.remote()) != pid  # Ray restarted the worker


def test_retry_budget_spent_ends_only_those_episodes(ray_driver, renderer):
    n = 12
    expected = local_run(renderer, n)
    workers = workers_of(ray_driver, 2, retries=0)
    fn, _ = killing(ray_driver, workers, after_calls=15)
    got = run_episodes(ScriptedPolicy(fn, renderer), workers.make, specs(n), CFG,
                       generator=__import__("torch").Generator().manual_seed(0))
    failed = [i for i, e in enumerate(got) if e.stop_reason == "env_error"]
    assert len(failed) == 3
    assert all("cluster.max_env_retries = 0" in (got[i].turns[-1].error or "") for i in failed)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if i not in failed:
            assert view(a) == view(b)


def test_a_replay_that_differs_fails_the_episode(ray_driver, renderer):
    workers = workers_of(ray_driver, 1, cls="flaky_env:Flaky", kwargs={})
    fn, _ = killing(ray_driver, workers, after_calls=3)
    got = run_episodes(ScriptedPolicy(fn, renderer), workers.make, specs(2), CFG,
                       generator=__import__("torch").Generator().manual_seed(0))
    assert [e.stop_reason for e in got] == ["env_error", "env_error"]
    assert all("not deterministic" in e.turns[-1].error for e in got)
