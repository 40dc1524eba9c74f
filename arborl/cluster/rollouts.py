"""Generation actors: Ray actors that hold a copy of the policy and roll out the groups assigned to them.

``cluster.generation = "actor"`` with ``cluster.generation_workers = N``. The trainer stays on the
driver; each :class:`GenerationActor` loads the start policy on its node, builds its own envs
from ``cfg.env`` and runs the same code as a single-process iteration
(:func:`arborl.train.rl.roll_specs`: the kept-KV-cache engine, then tree continuations and
branches) on its share of the iteration's groups.

Who does what, per iteration ``i``:

* The driver draws the iteration's tasks from its task stream (as the single-process run does)
  and splits the groups over the actors in order: actor ``j`` of ``N`` gets groups
  ``[j*T//N, (j+1)*T//N)`` of the ``T`` tasks. Its share comes back, and the iteration's
  episodes are the actors' group samples in actor order, then their continuations and branches.
* Sampling randomness. Synchronously (``rl.max_staleness = 0``) actor 0 samples from the state
  of the driver's sampling stream and sends its final state back, which the update then goes on
  with, exactly as in one process; actor ``j >= 1`` samples from a stream seeded by
  :func:`share_seed` (the run's seed, ``i``, ``j``). So one actor reproduces the single-process run
  bit for bit, and ``N`` actors reproduce themselves: the same seed and ``N`` give the same
  episodes and weights. ``N >= 2`` cannot equal the single-process run: there one ``torch.rand``
  per decoding step draws the Gumbel noise of every row of the batch from one stream, so which
  uniforms a row gets depends on the rows decoded beside it, and the batched forward pads rows
  to the longest one beside them. Sampling ahead (``rl.max_staleness >= 1``) every actor uses
  :func:`share_seed` streams (the driver's stream is busy with the updates meanwhile).
* Weight sync. After each update the driver puts the weights (a LoRA policy's merged) into the
  object store once, as one state dict; a rollout request carries the reference and the policy
  version, and an actor whose weights are of another version fetches them before sampling. Every
  turn records the version that sampled it (``Turn.policy_version``).
* Sampling ahead. The batch of iteration ``i`` is sampled by version
  :func:`~arborl.train.async_rollout.sampling_version` ``(i)``, like the in-process rollout worker:
  publishing version ``v`` submits iteration ``v + k`` to the actors at once, so the actors roll
  it out while the driver updates on iteration ``v``.
* Failures. Actors are created with ``max_restarts=-1``: Ray restarts one whose process died. Its
  shares in flight fail; each is submitted again, with the same random state and weights, so it
  yields the same episodes (after ``cluster.max_generation_retries`` re-submissions of one share
  the run stops with the error). Nothing else stops.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arborl.config import ConfigError
from arborl.train.async_rollout import Rollout, plain_state, sampling_version

_RESTART_WAIT_S = 120.0
"""How long the driver waits for Ray to bring a dead generation actor back (it loads the policy again)."""


class GenerationActor:
    """The actor body: the policy, the envs and the tokenizer of one generation worker.

    Args:
        cfg: The run's ``TrainConfig``.
        start_path: The checkpoint with the policy's architecture and tokenizer (readable on the node).
        actions: The env's finite action set (for branches).
        device: The torch device of the copy (``cuda`` when the actor reserves a GPU).
    """

    def __init__(self, cfg: Any, start_path: str, actions: list[str], device: str) -> None:
        from arborl.policy import load_policy
        from arborl.train.common import env_factory

        torch.set_num_threads(cfg.threads)
        self._cfg, self._actions = cfg, list(actions)
        self._model, self._tok = load_policy(start_path, device=device)
        # eval only: parameters that do not require grad make torch pick other CPU kernels in generation,
        # whose last bits differ from the driver's model (which trains, so requires grad)
        self._model.eval()
        self._make_env = env_factory(cfg.env)
        self._version: int | None = None  # no pushed weights loaded yet

    def pid(self) -> int:
        """This actor's process id (tests kill it)."""
        import os

        return os.getpid()

    def rollout(self, it: int, version: int, weights: list[Any], specs: list, gen_state: Tensor) -> tuple[Rollout, Tensor]:
        """Roll out ``specs`` of iteration ``it`` with the weights of ``version``; the batch and the stream's end state.

        ``weights`` is ``[ObjectRef]`` of the version's state dict, fetched only when this actor
        holds another version (a list, so that Ray does not fetch it for every request).
        """
        import ray

        from arborl.train.profile import PhaseTimer
        from arborl.train.rl import roll_specs

        if version != self._version:
            self._model.load_state_dict(ray.get(weights[0]))
            self._version = version
        gen = torch.Generator()
        gen.set_state(gen_state)
        ro = roll_specs(self._cfg, it, self._model, self._tok, gen, specs, self._make_env, self._actions, version,
                        PhaseTimer())
        return ro, gen.get_state()

    def weights(self) -> tuple[int | None, dict[str, Tensor]]:
        """The version this actor holds and its weights on the CPU (the weight-sync test reads them)."""
        return self._version, {k: v.detach().cpu() for k, v in self._model.state_dict().items()}


def share_seed(seed: int, it: int, j: int) -> int:
    """The seed of actor ``j``'s sampling stream in iteration ``it`` of a run seeded ``seed`` (stable across runs)."""
    digest = hashlib.blake2b(f"arborl-generation:{seed}:{it}:{j}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def split_groups(specs: list, group_size: int, n: int) -> list[list]:
    """``specs`` (whole groups of ``group_size``, in order) cut into ``n`` runs of consecutive groups, as even as possible."""
    groups = len(specs) // group_size
    cuts = [j * groups // n * group_size for j in range(n + 1)]
    return [specs[cuts[j]:cuts[j + 1]] for j in range(n)]


def merge(parts: list[Rollout], version: int) -> Rollout:
    """One iteration's batch from the actors' shares: all group samples first, then continuations and branches."""
    episodes = [e for ro in parts for e in ro.episodes[:ro.n_sampled]]
    episodes += [e for ro in parts for e in ro.episodes[ro.n_sampled:]]
    seconds = {k: max(ro.seconds.get(k, 0.0) for ro in parts) for k in ("rollout", "branch")}  # actors run side by side
    return Rollout(episodes, sum(ro.n_sampled for ro in parts), version, seconds,
                   sum(ro.prefix_reused for ro in parts), sum(ro.prefix_prefilled for ro in parts))


class _Share:
    """One actor's part of one iteration: the request (kept to re-submit it) and its pending result."""

    def __init__(self, j: int, args: tuple, ref: Any) -> None:
        self.j, self.args, self.ref, self.retries = j, args, ref, 0


class ActorRollouts:
    """The generation actors of a run, with the rollout worker protocol (``publish``, ``take``, ``close``).

    Args:
        cfg: The run's ``TrainConfig`` (``cluster.generation_workers`` actors, ``rl.max_staleness``).
        model: The trainer's policy at version ``start`` (published at once).
        start_path: The checkpoint the actors load the architecture and tokenizer from.
        actions: The env's finite action set.
        task_type: The env's task type (the specs' ``task_type``).
        start: The first iteration (and the version of ``model``).
        stop: One past the last iteration.
        gen: The driver's sampling stream (continued by actor 0 when synchronous).
        task_gen: The driver's task stream (the tasks are drawn here, in iteration order).

    Needs Ray connected (the pipeline's :func:`arborl.cluster.cluster_envs`).
    """

    def __init__(self, cfg: Any, model: torch.nn.Module, start_path: Path, actions: list[str], task_type: str, *,
                 start: int, stop: int, gen: torch.Generator, task_gen: torch.Generator) -> None:
        import ray

        from arborl.policy.vision import image_spec

        if image_spec(model) is not None:
            raise ConfigError('cluster.generation = "actor" does not support a vision policy yet: the actors have no '
                              'store to put the observations\' images in; set cluster.generation = "http"')
        c = cfg.cluster
        self.cfg, self.task_type, self.start, self.stop = cfg, task_type, start, stop
        self.k, self.gen, self.task_gen = cfg.rl.max_staleness, gen, task_gen
        self.retries = 0
        """Shares re-submitted after their actor died, all iterations together."""
        device = "cuda" if c.generation_worker_gpus > 0 else "cpu"
        actor_cls = ray.remote(GenerationActor).options(num_cpus=c.generation_worker_cpus,
                                                        num_gpus=c.generation_worker_gpus, max_restarts=-1,
                                                        max_task_retries=0)
        self.actors = [actor_cls.remote(cfg, str(start_path), actions, device) for _ in range(c.generation_workers)]
        ray.get([a.pid.remote() for a in self.actors])  # every actor up (or its error) before the run starts
        n = len(self.actors)
        print(f"generation actors: {n} Ray actor{'s' * (n != 1)} holding the policy, rolling out each iteration's groups"
              f"{' ahead of the update' if self.k else ''}; a killed actor is restarted, its share rolled out again",
              flush=True)
        self._pending: dict[int, list[_Share]] = {}
        self.publish(start, model)

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Put ``model``'s weights into the object store as ``version`` and submit the iterations it samples."""
        import ray

        due = range(self.start, self.start + self.k + 1) if version == self.start else [version + self.k]
        due = [it for it in due if it < self.stop and it not in self._pending]
        if due:  # after the last update nothing is sampled: no weights to ship
            weights = [ray.put(plain_state(model))]
            for it in due:
                self._submit(it, weights)

    def _submit(self, it: int, weights: list[Any]) -> None:
        from arborl.train.rl import rollout_specs

        version = sampling_version(it, self.start, self.k)
        specs = rollout_specs(self.cfg, it, self.task_gen, self.task_type)
        shares = []
        for j, part in enumerate(split_groups(specs, self.cfg.rl.group_size, len(self.actors))):
            if not part:
                continue  # fewer tasks than actors
            if j == 0 and not self.k:
                state = self.gen.get_state()
            else:
                state = torch.Generator().manual_seed(share_seed(self.cfg.seed, it, j)).get_state()
            args = (it, version, weights, part, state)
            shares.append(_Share(j, args, self.actors[j].rollout.remote(*args)))
        self._pending[it] = shares

    def take(self, iteration: int) -> Rollout:
        """The batch of ``iteration`` (waits for every share; a share whose actor died is rolled out again)."""
        shares = self._pending.pop(iteration)
        got = [self._result(s) for s in shares]
        if not self.k:
            self.gen.set_state(got[0][1])  # the update continues the stream where actor 0 left it
        return merge([ro for ro, _ in got], shares[0].args[1])

    def _result(self, share: _Share) -> tuple[Rollout, Tensor]:
        import ray
        from ray.exceptions import RayActorError

        while True:
            try:
                return ray.get(share.ref)
            except RayActorError as exc:
                limit = self.cfg.cluster.max_generation_retries
                if share.retries >= limit:
                    n = share.retries + 1
                    raise RuntimeError(f"generation actor {share.j} died {n} time{'s' * (n != 1)} rolling out "
                                       f"iteration {share.args[0]} (cluster.max_generation_retries = {limit}; raise "
                                       f"it to retry more): {exc}") from exc
                share.retries += 1
                self.retries += 1
                print(f"generation actor {share.j} died; its share of iteration {share.args[0]} is rolled out again "
                      f"(retry {share.retries} of {limit})", flush=True)
                self._wait_up(share.j, exc)
                share.ref = self.actors[share.j].rollout.remote(*share.args)

    def _wait_up(self, j: int, cause: BaseException) -> None:
        """Wait until Ray has restarted actor ``j`` (a request sent while it restarts fails at once)."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + _RESTART_WAIT_S
        while True:
            try:
                ray.get(self.actors[j].pid.remote())
                return
            except RayActorError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"generation actor {j} did not come back within {_RESTART_WAIT_S:g} s: "
                                       f"{cause}") from exc
                time.sleep(0.2)

    def close(self) -> None:
        """Stop the actors (a share in flight is dropped)."""
        import ray

        self._pending.clear()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def __enter__(self) -> ActorRollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
