"""Env workers as Ray actors, and the driver-side handle the rollout engine steps like a local env.

What runs where. The driver (the ``arborl`` process) keeps the trainer, the policy and the rollout
engine. Each :class:`EnvWorker` actor builds envs from the run's ``[env]`` section and owns them:
``reset``, ``step``, ``format_observation``, ``state_key`` and every optional env method run in
the actor's process, so a tool call or a sandboxed program runs there too (an env's sandbox and
tools live inside its env). The engine sees a :class:`RemoteEnv` per slot and calls it from its
worker threads exactly as it calls a local env; one ``step`` is one round trip (the actor
returns the step result with the rendered observation and the next state key).

Failure handling. Actors are created with ``max_restarts=-1``: Ray restarts a worker whose
process died. The envs it held are gone, so a :class:`RemoteEnv` that finds its worker dead
re-creates its env on the restarted worker, resets it with the episode's seed and options and
re-plays the episode's actions so far (arborl's envs are deterministic given seed and actions,
the same assumption continuations rely on), then retries the call. A re-played step whose
reward or observation differs from what was recorded fails that episode instead (an env that
is not deterministic cannot be resumed). The episode records its retries in the next step's
``info["env_worker_retries"]``; after ``cluster.max_env_retries`` retries of one episode the
call raises, which ends that episode with stop_reason "env_error". Nothing else stops.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from arborl.env.base import StepResult

_RESTART_WAIT_S = 60.0
"""How long a handle waits for Ray to bring a dead worker back before it gives up the episode."""


class EnvWorker:
    """The actor body: envs by id, each ``cls(**kwargs)``, stepped here.

    Args:
        cls: Import path ``package.module:ClassName`` of the env (``env.cls``, already checked by
            the driver; only the env's own module is imported here, not the trainer's torch).
        kwargs: The env's keyword arguments (``env.kwargs``).
    """

    def __init__(self, cls: str, kwargs: dict[str, Any]) -> None:
        module, _, name = cls.partition(":")
        self._cls, self._kwargs = getattr(importlib.import_module(module), name), dict(kwargs)
        self._envs: dict[str, Any] = {}

    def pid(self) -> int:
        """This worker's process id (tests kill it)."""
        import os

        return os.getpid()

    def open(self, env_id: str) -> str:
        """Build the env ``env_id``; its class name."""
        self._envs[env_id] = env = self._cls(**self._kwargs)
        return type(env).__name__

    def reset(self, env_id: str, seed: int | None, options: dict | None) -> tuple[Any, dict, Any, Any]:
        """``reset`` plus the rendered observation and state key (errors returned, raised on the driver)."""
        env = self._envs[env_id]
        obs, info = env.reset(seed=seed, options=options)
        return obs, info, *_render(env, obs)

    def step(self, env_id: str, action: str) -> tuple[StepResult, Any, Any]:
        """``step`` plus the rendered observation and the next state key."""
        env = self._envs[env_id]
        res = env.step(action)
        return res, *_render(env, res.obs)

    def call(self, env_id: str, name: str, args: tuple, kwargs: dict) -> Any:
        """Call the env's method ``name``."""
        return getattr(self._envs[env_id], name)(*args, **kwargs)

    def attr(self, env_id: str, name: str) -> tuple[str, Any]:
        """``("method", None)``, ``("value", v)`` or ``("missing", None)`` for the env's attribute ``name``."""
        value = getattr(self._envs[env_id], name, _MISSING)
        if value is _MISSING:
            return "missing", None
        return ("method", None) if callable(value) else ("value", value)

    def close(self, env_id: str) -> None:
        """Close and forget the env ``env_id``."""
        env = self._envs.pop(env_id, None)
        if env is not None:
            env.close()


_MISSING = object()


@dataclass(frozen=True)
class _Raised:
    """An exception an actor caught, re-raised when the driver asks for that value."""

    error: BaseException


def _render(env: Any, obs: Any) -> tuple[Any, Any]:
    out = []
    for fn in (lambda: env.format_observation(obs), env.state_key):
        try:
            out.append(fn())
        except Exception as exc:  # e.g. state_key of an ended episode: raised only if asked for
            out.append(_Raised(exc))
    return out[0], out[1]


def _value(v: Any) -> Any:
    if isinstance(v, _Raised):
        raise v.error
    return v


@dataclass
class EnvWorkers:
    """The env worker actors of a run; ``make()`` is the env factory the rollout engine gets.

    Args:
        actors: Ray actor handles of :class:`EnvWorker` (created with ``max_restarts=-1``).
        max_retries: Retries of one episode after its worker died (``cluster.max_env_retries``).
    """

    actors: list[Any]
    max_retries: int = 3
    retries: int = 0
    """Episode retries so far, all envs together."""
    _next: Any = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def make(self) -> RemoteEnv:
        """A new env on the next worker (round robin)."""
        actor = self.actors[next(self._next) % len(self.actors)]
        return RemoteEnv(self, actor)

    def count_retry(self) -> None:
        """Count one episode retry."""
        with self._lock:
            self.retries += 1


@dataclass
class _Played:
    """What an episode did since ``reset``: enough to rebuild its env on a restarted worker."""

    seed: int | None = None
    options: dict | None = None
    steps: list[tuple[str, float, Any]] = field(default_factory=list)
    """(action, reward, rendered observation) of each step."""
    retries: int = 0
    noted: int = 0
    """Retries already reported in a step's info."""


class RemoteEnv:
    """An env that lives in an :class:`EnvWorker` actor; the contract's methods, one round trip each.

    ``format_observation`` and ``state_key`` answer from what the last ``reset`` / ``step``
    returned (a method such as ``expert_action`` must not change the env's state, as the contract
    says); other attributes (``actions``, ``expert_action``, ...) are looked up on the remote env.
    """

    def __init__(self, workers: EnvWorkers, actor: Any) -> None:
        self._workers, self._actor = workers, actor
        self._id = uuid.uuid4().hex
        self._methods: set[str] = set()
        self.remote_class_name = self._open(None)
        """The class name of the env in the worker (the rollout engine records it as the env's name)."""
        self._played = _Played()
        self._last: tuple[Any, Any, Any] | None = None  # (obs, rendered, state key) of the last call

    def _remote(self, method: Any, *args: Any) -> Any:
        import ray

        return ray.get(method.remote(*args))

    def _call(self, name: str, *args: Any) -> Any:
        """``actor.name(env_id, *args)``; a dead worker's env is rebuilt first (see the module docstring)."""
        from ray.exceptions import RayActorError

        while True:
            try:
                return self._remote(getattr(self._actor, name), self._id, *args)
            except RayActorError as exc:
                self._recover(exc)

    def _open(self, cause: BaseException | None) -> str:
        """Build this env in the worker, waiting for Ray to restart it if it is down; its class name."""
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + _RESTART_WAIT_S
        while True:
            try:
                return self._remote(self._actor.open, self._id)
            except RayActorError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"env worker did not come back within {_RESTART_WAIT_S:g} s: "
                                       f"{cause or exc}") from exc
                time.sleep(0.2)

    def _recover(self, exc: BaseException) -> None:
        """Rebuild this env on the restarted worker and re-play the episode so far."""
        played = self._played
        if played.retries >= self._workers.max_retries:
            raise RuntimeError(f"env worker died {played.retries + 1} times in this episode "
                               f"(cluster.max_env_retries = {self._workers.max_retries}): {exc}") from exc
        played.retries += 1
        self._workers.count_retry()
        self._open(exc)
        if self._last is None:
            return  # no episode started yet: the rebuilt env is all there is to do
        self._remote(self._actor.reset, self._id, played.seed, played.options)
        for i, (action, reward, shown) in enumerate(played.steps):
            res, again, _ = self._remote(self._actor.step, self._id, action)
            if float(res.reward) != reward or again != shown:
                raise RuntimeError(f"env worker restarted, but re-playing step {i} of the episode gave another "
                                   "result (the env is not deterministic given seed and actions); episode dropped")

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Reset the remote env."""
        self._played = replace(_Played(), seed=seed, options=options)
        obs, info, shown, key = self._call("reset", seed, options)
        self._last = (obs, shown, key)
        return obs, info

    def step(self, action: str) -> StepResult:
        """Step the remote env; after a retry, ``info["env_worker_retries"]`` says how many this episode had."""
        res, shown, key = self._call("step", action)
        self._played.steps.append((action, float(res.reward), shown))
        self._last = (res.obs, shown, key)
        played = self._played
        if played.retries > played.noted:
            played.noted = played.retries
            res = replace(res, info={**(res.info or {}), "env_worker_retries": played.retries})
        return res

    def format_observation(self, obs: Any) -> Any:
        """The rendering of ``obs`` (the worker's, made with the step that returned it)."""
        if self._last is not None and obs is self._last[0]:
            return _value(self._last[1])
        return self._call("call", "format_observation", (obs,), {})

    def state_key(self) -> Any:
        """The state key after the last reset / step."""
        if self._last is not None:
            return _value(self._last[2])
        return self._call("call", "state_key", (), {})

    def close(self) -> None:
        """Close the remote env (a dead worker took it with it)."""
        from ray.exceptions import RayActorError

        with contextlib.suppress(RayActorError):
            self._remote(self._actor.close, self._id)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names RemoteEnv does not define: the env's optional attributes and methods.
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._methods:  # a method stays a method: one round trip per call, not two
            return lambda *args, **kwargs: self._call("call", name, args, kwargs)
        kind, value = self._call("attr", name)
        if kind == "missing":
            raise AttributeError(f"{self.remote_class_name} has no attribute {name!r}")
        if kind == "value":
            return value
        self._methods.add(name)
        return lambda *args, **kwargs: self._call("call", name, args, kwargs)
