"""Joining or starting Ray for a run, and the env worker actors' lifetime.

:func:`cluster_envs` is the one place a run touches Ray: with ``cluster.address = ""`` it hands
back the local env factory and Ray is never imported.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from arborl.cluster.config import ClusterConfig, require_ray
from arborl.cluster.envs import EnvWorker, EnvWorkers


@contextlib.contextmanager
def connect(cfg: ClusterConfig) -> Iterator[Any]:
    """Ray, joined or started as ``cfg.address`` says; shut down at the end if this call started it.

    A Ray already initialised in this process (e.g. by a notebook) is used as it is and left running.
    """
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    # workers on this machine start in the driver's directory with its environment (PYTHONPATH
    # included); nodes of a joined cluster need arborl and the env's package installed
    options: dict[str, Any] = {"namespace": "arborl", "logging_level": logging.WARNING, "log_to_driver": False}
    if cfg.address == "local":
        options.update(num_cpus=cfg.local_cpus or None, object_store_memory=cfg.object_store_mb * 2**20,
                       include_dashboard=False)
    else:
        options["address"] = cfg.address
    try:
        ray.init(**options)
    except (ConnectionError, ValueError, RuntimeError) as e:
        from arborl.config import ConfigError

        raise ConfigError(f"cluster.address = {cfg.address!r}: cannot reach a Ray cluster ({e}); start one with "
                          '`ray start --head` or set cluster.address = "local"') from None
    try:
        yield ray
    finally:
        ray.shutdown()


def start_env_workers(ray: Any, cfg: ClusterConfig, env_spec: Any) -> EnvWorkers:
    """``cfg.env_workers`` :class:`EnvWorker` actors (restarted by Ray when their process dies)."""
    resources: dict[str, Any] = {"num_cpus": cfg.env_worker_cpus, "max_restarts": -1, "max_task_retries": 0,
                                 "max_concurrency": cfg.env_worker_threads}
    if cfg.env_worker_memory_mb:
        resources["memory"] = cfg.env_worker_memory_mb * 2**20
    actor_cls = ray.remote(EnvWorker).options(**resources)
    actors = [actor_cls.remote(env_spec.cls, dict(env_spec.kwargs)) for _ in range(cfg.env_workers)]
    ray.get([a.pid.remote() for a in actors])  # every worker up (or its error) before the run starts
    return EnvWorkers(actors, max_retries=cfg.max_env_retries)


@contextlib.contextmanager
def cluster_envs(cfg: ClusterConfig, env_spec: Any, make_env: Callable[[], Any],
                 say: Callable[[str], None] = lambda msg: None) -> Iterator[Callable[[], Any]]:
    """The env factory of a run: ``make_env`` itself without a cluster, else one of envs in Ray actors.

    Args:
        cfg: The ``[cluster]`` section.
        env_spec: The ``[env]`` section (each worker builds its envs from it).
        make_env: The local factory, returned as is when ``cfg.address`` is ``""``.
        say: Where the line that names the workers and the cluster goes.
    """
    if not cfg.enabled:
        yield make_env
        return
    with connect(cfg) as ray:
        workers = start_env_workers(ray, cfg, env_spec)
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        say(f"env workers: {cfg.env_workers} Ray actors on a cluster of {nodes} node{'s' * (nodes != 1)} "
            f"(cluster.address = {cfg.address!r}); a killed worker is restarted, its episodes retried")
        try:
            yield workers.make
        finally:
            for actor in workers.actors:
                ray.kill(actor, no_restart=True)
