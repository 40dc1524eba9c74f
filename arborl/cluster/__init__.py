"""Scale-out on Ray: env workers as actors, the trainer and generation on the driver (docs/scale.md).

Importing this package does not import Ray; only a run with ``cluster.address`` set does.
"""

from arborl.cluster.config import ClusterConfig, require_ray
from arborl.cluster.envs import EnvWorker, EnvWorkers, RemoteEnv
from arborl.cluster.runtime import cluster_envs, connect, start_env_workers

__all__ = ["ClusterConfig", "EnvWorker", "EnvWorkers", "RemoteEnv", "cluster_envs", "connect", "require_ray",
           "start_env_workers"]
