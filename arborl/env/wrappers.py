"""The episode-boundary rules every env would otherwise repeat, kept once in a wrapper.

Gymnasium enforces call order in one wrapper (``OrderEnforcing``) instead of in each env; arborl
does the same with :class:`EpisodeGuard`, and the rollout engine wraps every env it drives with
:func:`guard`. An env itself only has to play one episode correctly (what
:func:`arborl.env.check.check_env` checks); the guard adds:

* ``step`` before the first ``reset`` raises ``RuntimeError`` (a caller bug, as in Gymnasium);
* a ``step`` after the episode ended (``terminated`` or ``truncated`` was returned) is answered
  without calling the env: the final observation again, reward ``0.0``, ``truncated=True``,
  ``info["action_valid"] = False``, ``info["error"]`` = :data:`ENDED_ERROR` and the episode's
  ``info["success"]`` again, so the state cannot change and the trainer is never killed;
* everything else (``format_observation``, ``state_key``, ``close`` and the optional attributes
  ``actions``, ``expert_action``, ``task_type``, ``max_steps``, ...) is the env's own.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from arborl.env.base import Env, StepResult

ENDED_ERROR = "step() called after the episode ended; call reset() to start a new episode"
"""``info["error"]`` of a step after the episode ended."""


class EpisodeGuard:
    """Wrap ``env`` so that steps before ``reset`` and after the end follow the contract.

    Args:
        env: Any object following :class:`arborl.env.base.Env`.

    Attributes:
        unwrapped: The wrapped env.
    """

    def __init__(self, env: Env) -> None:
        self.unwrapped = env
        self._started = False
        self._ended: StepResult | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Reset the env and start a new episode."""
        out = self.unwrapped.reset(seed=seed, options=options)
        self._started, self._ended = True, None
        return out

    def step(self, action: str) -> StepResult:
        """The env's step, or the contract's answer once the episode has ended."""
        if not self._started:
            raise RuntimeError(f"{type(self.unwrapped).__name__}: call reset() before step()")
        if self._ended is not None:
            info = {"action_valid": False, "action": None, "error": ENDED_ERROR,
                    "success": self._ended.info.get("success")}
            return StepResult(self._ended.obs, 0.0, False, True, info)
        res = self.unwrapped.step(action)
        if isinstance(res, StepResult) and (res.terminated or res.truncated):
            self._ended = res
        return res

    def format_observation(self, obs: Any) -> str | list[dict[str, Any]]:
        """The env's own rendering."""
        return self.unwrapped.format_observation(obs)

    def state_key(self) -> Hashable:
        """The env's own key (unchanged after the end: the env is no longer stepped)."""
        return self.unwrapped.state_key()

    def close(self) -> None:
        """Close the env."""
        self.unwrapped.close()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the guard does not define: the env's optional attributes.
        if name == "unwrapped":
            raise AttributeError(name)
        return getattr(self.unwrapped, name)


def guard(env: Env) -> EpisodeGuard:
    """``env`` wrapped in an :class:`EpisodeGuard` (returned as is when it already is one)."""
    return env if isinstance(env, EpisodeGuard) else EpisodeGuard(env)
