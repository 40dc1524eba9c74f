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

Two workers with the same protocol: :class:`RolloutProcess` (``rl.rollout_worker = "process"``,
the default) samples in a second interpreter that builds its own envs from ``cfg.env`` and its own
policy copy, and gets each version's weights as a state dict over a queue; :class:`RolloutWorker`
(``"thread"``) samples on a thread of this process from a deep copy of the model. With a small
model both the rollout and the update are mostly Python between tiny torch ops, so a thread
shares the GIL with the update and overlapped nothing (0.91-0.95x of running them one after
the other, ``bench/async_overlap.py``, docs/async.md), where a process did.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor

from arborl.trajectory import Episode


@dataclasses.dataclass
class Rollout:
    """One iteration's rolled-out episodes and how they were made.

    Attributes:
        episodes: the group members first (``n_sampled`` of them), then tree continuations and branches.
        n_sampled: how many of ``episodes`` are group samples from the start state.
        version: the policy version (updates applied) whose weights sampled them.
        seconds: wall seconds of the ``rollout`` and ``branch`` phases where they ran.
        prefix_reused: trunk-cache tokens the continuations reused (``train/prefix_reused``).
        prefix_prefilled: trunk-cache tokens the continuations prefilled (``train/prefix_prefilled``).
    """

    episodes: list[Episode]
    n_sampled: int
    version: int
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    prefix_reused: int = 0
    prefix_prefilled: int = 0


Sampler = Callable[[int, torch.nn.Module, int], Rollout]
"""``sample(iteration, model, version) -> Rollout``: roll out one iteration's batch with ``model``."""


def sampling_version(iteration: int, start: int, max_staleness: int) -> int:
    """The policy version that samples the batch of ``iteration`` (``start``: the version at the first one)."""
    return max(start, iteration - max_staleness)


def snapshot(model: torch.nn.Module) -> dict[str, Tensor]:
    """A detached copy of ``model``'s state dict (the weights of one policy version)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class _Worker:
    """A context manager whose exit calls ``close`` (both workers)."""

    def close(self) -> None:
        """Stop sampling."""

    def __enter__(self) -> _Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RolloutWorker(_Worker):
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


def plain_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights a plain copy of the policy takes: a LoRA model's merged, on the CPU, detached."""
    from arborl.policy.model import is_lora, merge_lora

    plain = merge_lora(model) if is_lora(model) else model
    return {k: v.detach().to("cpu", copy=True) for k, v in plain.state_dict().items()}


class RolloutProcess(_Worker):
    """The :class:`RolloutWorker` protocol in a second process (``spawn``: a fresh interpreter).

    Args:
        cfg: the run's ``TrainConfig``; the process builds its envs from ``cfg.env``.
        start_path: the checkpoint the process loads its policy copy from (the architecture; the
            weights come from :meth:`publish`).
        model: the policy at version ``start`` (published at once).
        start, stop, max_staleness: as for :class:`RolloutWorker`.
        seed: seed of the process's sampling stream.
        task_rng: state of the task-drawing generator (the process draws the tasks from then on).
    """

    def __init__(self, cfg: Any, start_path: Path, model: torch.nn.Module, *, start: int, stop: int,
                 max_staleness: int, seed: int, task_rng: Tensor) -> None:
        if max_staleness < 1:
            raise ValueError(f"max_staleness is {max_staleness}; a rollout worker needs at least 1")
        ctx = mp.get_context("spawn")
        self._weights, self._out = ctx.Queue(), ctx.Queue()
        self.publish(start, model)
        self._proc = ctx.Process(target=_process_main, name="arborl-rollout", daemon=True,
                                 args=(cfg, Path(start_path), seed, task_rng, start, stop, max_staleness,
                                       self._weights, self._out))
        self._proc.start()

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Send ``model``'s current weights to the process as policy ``version``."""
        self._weights.put((version, plain_state(model)))

    def take(self, iteration: int) -> Rollout:
        """The batch of ``iteration`` (batches arrive in order); raises the process's error, if any."""
        while True:
            try:
                got_it, got = self._out.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._proc.is_alive():
                    raise RuntimeError(f"the rollout process died (exit code {self._proc.exitcode}) before sampling "
                                       f"iteration {iteration}") from None
        if isinstance(got, BaseException):
            raise got
        if got_it != iteration:
            raise RuntimeError(f"the rollout process sent iteration {got_it} where {iteration} was due")
        return got

    def close(self) -> None:
        """Stop the process after the batch it is sampling (terminated if it does not stop in 60 s)."""
        self._weights.put(None)
        self._proc.join(timeout=60)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join()


def _process_main(cfg: Any, start_path: Path, seed: int, task_rng: Tensor, start: int, stop: int, k: int,
                  weights_q: Any, out_q: Any) -> None:
    """The rollout process: sample each iteration once its version's weights have arrived."""
    it = start
    try:
        from arborl.train.rl import sample_in_process

        sample = sample_in_process(cfg, start_path, seed, task_rng)
        have, loaded = -1, -1
        weights: dict[str, Tensor] | None = None
        for it in range(start, stop):
            version = sampling_version(it, start, k)
            while have < version:  # versions arrive in order; never read past the one needed
                msg = weights_q.get()
                if msg is None:
                    return
                have, weights = msg
            out_q.put((it, sample(it, weights if loaded != have else None, version)))
            loaded = have
    except BaseException:  # the trainer raises it at its next take()
        out_q.put((it, RuntimeError("the rollout process failed:\n" + traceback.format_exc())))
