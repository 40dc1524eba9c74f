"""Generation workers: an ``arborl serve`` server per Ray actor, so generation runs on cluster nodes.

Each :class:`GenerationWorker` loads a checkpoint on its node and serves it over the
OpenAI-compatible API of :mod:`arborl.serve` at the node's address. The driver talks to the
workers like to any generation servers: their URLs go in ``policy.urls`` with
``policy.backend = "http"`` (the HTTP rollout policy spreads episodes over them, moves the episodes
of a server that died to the others, and pushes the trainer's weights to every one through
``/update_weights_from_disk``; the workers must be able to read the sync directory, i.e. the same
machine or a shared disk). A worker that dies is not restarted: a restarted server would listen
on another port, and the policy already carries on with the servers that are left.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any


class GenerationWorker:
    """The actor body: ``arborl serve CHECKPOINT`` on this node, on a free port.

    Args:
        checkpoint: Hugging Face checkpoint directory readable on the worker's node.
        device: ``auto`` (CUDA when the node has it), ``cpu``, ``cuda``...
        threads: torch intra-op threads of the server.
    """

    def __init__(self, checkpoint: str, device: str = "auto", threads: int = 1) -> None:
        import ray
        import torch

        from arborl.serve.app import PolicyServer
        from arborl.serve.engine import ServedModel

        torch.set_num_threads(threads)
        served = ServedModel(checkpoint, device=device)
        self._server = PolicyServer(served, host=ray.util.get_node_ip_address()).start()

    def url(self) -> str:
        """The server root, ``http://NODE_IP:PORT`` (an entry of ``policy.urls``)."""
        return self._server.url

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()


def start_generation_workers(ray: Any, checkpoint: str, n: int, *, cpus: float = 1.0, gpus: float = 0.0,
                             device: str = "auto", threads: int = 1) -> tuple[list[Any], list[str]]:
    """``n`` :class:`GenerationWorker` actors serving ``checkpoint``; the actors and their URLs.

    Args:
        ray: The connected ``ray`` module (:func:`arborl.cluster.connect`).
        checkpoint: What to serve (readable on every node the workers land on).
        n: Workers (>= 1), one server each.
        cpus: CPUs Ray reserves per worker.
        gpus: GPUs Ray reserves per worker (0 on CPU-only clusters).
        device: The servers' torch device.
        threads: torch threads per server.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"generation workers: n is {n!r}; use an integer >= 1")
    actor_cls = ray.remote(GenerationWorker).options(num_cpus=cpus, num_gpus=gpus, max_restarts=0)
    actors = [actor_cls.remote(str(checkpoint), device, threads) for _ in range(n)]
    return actors, ray.get([a.url.remote() for a in actors])


def with_generation_workers(cfg: Any, checkpoint: str, say: Any = lambda msg: None) -> tuple[Any, list[Any]]:
    """``cfg`` with the URLs of ``cluster.generation_workers`` new workers added to ``policy.urls``.

    Called by the pipeline inside :func:`arborl.cluster.cluster_envs` (Ray is connected), once the
    start policy ``checkpoint`` exists; the RL stage then syncs its weights to every worker.
    Without generation workers, ``(cfg, [])``. The caller keeps the returned actors referenced
    (Ray stops an actor whose last handle is dropped); they stop with the run's Ray connection.
    """
    n = cfg.cluster.generation_workers
    if not n or cfg.cluster.generation != "http":  # "actor": arborl.cluster.rollouts starts them in the RL stage
        return cfg, []
    import ray

    device = "cuda" if cfg.cluster.generation_worker_gpus > 0 else "cpu"
    actors, urls = start_generation_workers(ray, checkpoint, n, cpus=cfg.cluster.generation_worker_cpus,
                                            gpus=cfg.cluster.generation_worker_gpus, device=device)
    say(f"generation workers: {n} arborl serve actors at {', '.join(urls)}")
    return replace(cfg, policy=replace(cfg.policy, urls=[*cfg.policy.urls, *urls])), actors
