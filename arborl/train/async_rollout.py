"""Rollouts that run ahead of the update by at most ``rl.max_staleness`` policy versions.

With ``rl.max_staleness = k >= 1`` a :class:`RolloutWorker` thread samples the batch of iteration
``i + 1`` (and later ones) while the main thread updates the policy on the batch of iteration
``i``. The worker holds its own copy of the policy weights; after each update the trainer
:meth:`~RolloutWorker.publish` es a snapshot of the new weights as the next policy version, and the
worker loads it before sampling a batch that needs it.

Which weights sample which batch is fixed, not raced: the batch of iteration ``i`` is sampled by
version :func:`sampling_version` ``(i) = max(start, i - k)``, so a run is reproducible and no batch
is ever trained on more than ``k`` versions after the weights that sampled it. Every turn records
that version (``Turn.policy_version``), and the update corrects for the gap with decoupled PPO
(:func:`arborl.loss.ppo_clip_loss` with ``prox_logp``; docs/async.md says why).

A thread, not a process: the rollout's Python overhead holds the GIL between tiny torch ops, but
torch releases it inside every kernel, and the measured overlap (docs/async.md) is what a second
process would buy without pickling envs, episodes and weights across a process boundary.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable

import torch
from torch import Tensor

from arborl.rollout.kvcache import PrefixCache
from arborl.trajectory import Episode


@dataclasses.dataclass
class Rollout:
    """One iteration's rolled-out episodes and how they were made.

    Attributes:
        episodes: the group members first (``n_sampled`` of them), then tree continuations and branches.
        n_sampled: how many of ``episodes`` are group samples from the start state.
        trunk_kv: the trunk caches the continuations started from (``None`` without branches or trees).
        version: the policy version (updates applied) whose weights sampled them.
        seconds: wall seconds of the ``rollout`` and ``branch`` phases where they ran.
    """

    episodes: list[Episode]
    n_sampled: int
    trunk_kv: PrefixCache | None
    version: int
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


Sampler = Callable[[int, torch.nn.Module, int], Rollout]
"""``sample(iteration, model, version) -> Rollout``: roll out one iteration's batch with ``model``."""


def sampling_version(iteration: int, start: int, max_staleness: int) -> int:
    """The policy version that samples the batch of ``iteration`` (``start``: the version at the first one)."""
    return max(start, iteration - max_staleness)


def snapshot(model: torch.nn.Module) -> dict[str, Tensor]:
    """A detached copy of ``model``'s state dict (the weights of one policy version)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class RolloutWorker:
    """Sample iterations ``start .. stop - 1`` on a background thread, each with its :func:`sampling_version`.

    Args:
        sample: rolls out one iteration with a given model (see :data:`Sampler`).
        model: the policy at version ``start``; the worker samples from its own deep copy.
        start: the first iteration (and the version of ``model``).
        stop: one past the last iteration.
        max_staleness: ``k >= 1``, how many versions a batch may lag the weights it is trained with.
        threads: torch intra-op threads of the worker's thread.

    Use as a context manager: leaving the block stops the thread (a batch being sampled is finished
    and dropped). An error in the worker is raised by the next :meth:`take`.
    """

    def __init__(self, sample: Sampler, model: torch.nn.Module, *, start: int, stop: int, max_staleness: int,
                 threads: int = 1) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness is {max_staleness}; a rollout worker needs at least 1")
        self.sample, self.start, self.stop, self.k, self.threads = sample, start, stop, max_staleness, threads
        self._model = copy.deepcopy(model).eval().requires_grad_(False)
        self._weights: dict[int, dict[str, Tensor]] = {start: snapshot(model)}
        self._ready: dict[int, Rollout | BaseException] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="arborl-rollout", daemon=True)
        self._thread.start()

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Make ``model``'s current weights available as policy ``version`` (call after each update)."""
        weights = snapshot(model)
        with self._cond:
            self._weights[version] = weights
            self._cond.notify_all()

    def take(self, iteration: int) -> Rollout:
        """The batch of ``iteration`` (waits until it is sampled); raises the worker's error, if any."""
        with self._cond:
            self._cond.wait_for(lambda: iteration in self._ready or not self._thread.is_alive())
            got = self._ready.pop(iteration, None)
        if isinstance(got, BaseException):
            raise got
        if got is None:
            raise RuntimeError(f"the rollout worker stopped before sampling iteration {iteration}")
        return got

    def close(self) -> None:
        """Stop the worker after the batch it is sampling."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> RolloutWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _weights_for(self, version: int) -> dict[str, Tensor] | None:
        """Wait for ``version``'s weights (None once closed); older versions are dropped."""
        with self._cond:
            self._cond.wait_for(lambda: version in self._weights or self._closed)
            if self._closed:
                return None
            for v in [v for v in self._weights if v < version]:
                del self._weights[v]
            return self._weights[version]

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        loaded = self.start
        for it in range(self.start, self.stop):
            version = sampling_version(it, self.start, self.k)
            weights = self._weights_for(version)
            if weights is None:
                return
            try:
                if version != loaded:
                    self._model.load_state_dict(weights)
                    loaded = version
                got: Rollout | BaseException = self.sample(it, self._model, version)
            except BaseException as exc:  # handed to the trainer, which raises it
                got = exc
            with self._cond:
                self._ready[it] = got
                self._cond.notify_all()
            if isinstance(got, BaseException):
                return
