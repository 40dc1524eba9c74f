"""The ``[cluster]`` section: where env workers run (no Ray import here; Ray is an optional extra)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from arborl.config import ConfigError

_HOST_PORT = re.compile(r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


@dataclass(frozen=True)
class ClusterConfig:
    """Ray env workers and generation workers; the trainer stays on the driver."""

    address: str = ""
    """``""``: no Ray (envs step on the rollout engine's threads; Ray is never imported).
    ``"local"``: start a Ray instance on this machine for the run. ``"auto"``, ``"HOST:PORT"``
    (the head's GCS address) or ``"ray://HOST:PORT"`` (Ray Client): join an existing cluster
    (its nodes need arborl importable, like the driver)."""
    env_workers: int = 2
    """Env worker actors; each owns the envs assigned to it and steps them (``rollout.env_workers``
    driver threads wait on them, so keep that at least as large)."""
    env_worker_cpus: float = 1.0
    """CPUs Ray reserves for each env worker actor (fractions allowed, e.g. 0.5)."""
    env_worker_threads: int = 1
    """Env calls one actor runs at once (its envs are independent objects); more than 1 suits envs
    whose steps wait on tools or sandboxes, 1 steps an actor's envs one at a time."""
    env_worker_memory_mb: int = 0
    """Memory Ray reserves for each env worker actor, MB (0: no reservation)."""
    generation: str = "http"
    """What a generation worker is. ``"http"``: an ``arborl serve`` server in a Ray actor, for
    ``policy.backend = "http"``. ``"actor"``: a Ray actor that holds a copy of the policy in its
    process and rolls out the groups assigned to it with arborl's kept-KV-cache engine, stepping
    their envs itself (``policy.backend = "local"``); the trainer pushes each update's weights
    through the object store, and with ``rl.max_staleness >= 1`` the actors sample ahead while the
    driver updates (docs/scale.md)."""
    generation_workers: int = 0
    """Generation worker actors (``generation`` says which kind). ``"http"``: their URLs are added to
    ``policy.urls``; each serves the run's start policy and gets the trainer's weights. ``"actor"``:
    each iteration's groups are split over them in order; 0: generation stays on the driver."""
    generation_worker_cpus: float = 1.0
    """CPUs Ray reserves for each generation worker."""
    generation_worker_gpus: float = 0.0
    """GPUs Ray reserves for each generation worker (its server then runs on CUDA)."""
    max_generation_retries: int = 3
    """``generation = "actor"``: times one actor's share of an iteration is re-submitted after the actor
    died (Ray restarts it; the share is rolled out again from the same random state, so it yields
    the same episodes); then the run stops with the error."""
    max_env_retries: int = 3
    """Times one episode is retried on a restarted env worker after its worker died (then the
    episode ends with stop_reason "env_error")."""
    local_cpus: int = 0
    """CPUs of the instance ``address = "local"`` starts (0: Ray counts the machine's)."""
    object_store_mb: int = 100
    """Object store of the instance ``address = "local"`` starts, MB (env traffic is small)."""

    def __post_init__(self) -> None:
        a = self.address
        if not isinstance(a, str) or not (a in ("", "local", "auto") or _HOST_PORT.match(a)):
            raise ConfigError(
                f'cluster.address = {a!r} is not an address; use "" (no Ray), "local", "auto", "HOST:PORT" '
                'or "ray://HOST:PORT"'
            )
        if self.generation not in ("http", "actor"):
            raise ConfigError(f'cluster.generation = {self.generation!r}; use "http" (arborl serve actors) or "actor" '
                              "(actors that hold the policy in-process)")
        for name in ("env_workers", "env_worker_threads", "generation_workers", "max_env_retries", "max_generation_retries", "env_worker_memory_mb", "local_cpus", "object_store_mb"):
            v = getattr(self, name)
            low = 1 if name in ("env_workers", "env_worker_threads", "object_store_mb") else 0
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ConfigError(f"cluster.{name} = {v!r}; use an integer >= {low}")
        for name, low in (("env_worker_cpus", 0), ("generation_worker_cpus", 0), ("generation_worker_gpus", -1)):
            c = getattr(self, name)
            if not (isinstance(c, int | float) and not isinstance(c, bool) and math.isfinite(c) and c > low):
                raise ConfigError(f"cluster.{name} = {c!r}; use a {'positive' if low == 0 else 'non-negative'} number "
                                  "(fractions allowed, e.g. 0.5)")
        if self.generation_workers and not self.enabled:
            raise ConfigError("cluster.generation_workers needs a cluster: set cluster.address (e.g. \"local\")")
        if self.generation == "actor" and not self.generation_workers:
            raise ConfigError('cluster.generation = "actor" needs cluster.generation_workers >= 1 (the actors that '
                              'hold the policy); set it, or cluster.generation = "http"')
        if self.enabled:
            require_ray()  # refused at load time, before a run directory is touched

    @property
    def enabled(self) -> bool:
        """True when env calls go to Ray actors."""
        return self.address != ""


def require_ray():
    """Import Ray, or raise a ConfigError that names the install command."""
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            f"cluster.address is set but Ray is not installed ({e}); install it with pip install 'arborl[ray]' "
            'or set cluster.address = "" to run without Ray'
        ) from None
    return ray
