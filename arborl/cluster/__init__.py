"""Scale-out on Ray: env workers and generation servers as actors, the trainer on the driver (docs/scale.md).

Importing this package does not import Ray; only a run with ``cluster.address`` set does. The
generation actors that hold the policy in-process (``cluster.generation = "actor"``) are in
:mod:`arborl.cluster.rollouts`, imported by the RL stage (it needs torch).
"""

from arborl.cluster.config import ClusterConfig, require_ray
from arborl.cluster.envs import EnvWorker, EnvWorkers, RemoteEnv
from arborl.cluster.generation import GenerationWorker, start_generation_workers, with_generation_workers
from arborl.cluster.runtime import cluster_envs, connect, start_env_workers

__all__ = ["ClusterConfig", "EnvWorker", "EnvWorkers", "GenerationWorker", "RemoteEnv", "cluster_envs", "connect",
           "require_ray", "start_env_workers", "start_generation_workers", "with_generation_workers"]
