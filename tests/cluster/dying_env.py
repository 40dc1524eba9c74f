"""A test-only FrozenLake whose process exits once, mid-episode, inside a Ray actor."""

from __future__ import annotations

import os

from arborl.env.base import StepResult
from arborl.env.envs import FrozenLake

_steps = 0
"""Steps taken in this process, all envs together."""


class DyingLake(FrozenLake):
    """FrozenLake, except that the ``die_at``-th step in a generation actor's process exits it while ``flag`` exists.

    The flag file is removed first, so exactly one process dies in a run; the driver and the env
    worker actors never die.
    """

    def __init__(self, flag: str = "", die_at: int = 5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.flag, self.die_at = flag, die_at

    def step(self, action: str) -> StepResult:
        global _steps
        _steps += 1
        if self.flag and _steps >= self.die_at and _in_actor() and os.path.exists(self.flag):
            os.remove(self.flag)
            os._exit(1)
        return super().step(action)


def _in_actor() -> bool:
    """In a generation actor: a Ray actor that has imported arborl.cluster.rollouts (an env worker never does)."""
    import sys

    import ray

    return ("arborl.cluster.rollouts" in sys.modules and ray.is_initialized()
            and ray.get_runtime_context().get_actor_id() is not None)
