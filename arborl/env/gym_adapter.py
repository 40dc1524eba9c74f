"""Wrap a Gymnasium environment with a ``Discrete`` action space into the arborl env contract.

The model's text is parsed with :func:`arborl.env.parsing.extract_action` against
``action_names`` (default ``"0"``, ``"1"``, ...), so ``"<answer>2</answer>"`` or ``"Right"``
picks an action index; text that names no action is an invalid action (reward 0, state
unchanged, ``info["error"]`` set). Observations are shown with ``render_obs`` (default ``str``),
and ``state_key()`` is a hashable copy of the last observation (numpy arrays become
``(shape, dtype, bytes)``), which is exact for discrete-observation envs such as FrozenLake,
CliffWalking or Taxi and only a coarse anchor for continuous ones.

Gymnasium has no notion of success; by default an episode succeeds when it *terminates* with a
positive last reward or with ``info["is_success"]``/``info["success"]`` true (right for
FrozenLake and Taxi). Pass ``success_fn`` when that is wrong for an env (e.g. CliffWalking,
whose goal step has reward -1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from arborl.env.base import StepResult
from arborl.env.parsing import extract_action, invalid_message

SuccessFn = Callable[[Any, float, bool, bool, dict], bool]


def _default_success(obs: Any, reward: float, terminated: bool, truncated: bool, info: dict) -> bool:
    for key in ("is_success", "success"):
        if key in info:
            return bool(info[key])
    return terminated and reward > 0


def to_hashable(value: Any) -> Hashable:
    """A hashable, equality-preserving copy of an observation (arrays, dicts, lists, scalars)."""
    if hasattr(value, "shape") and hasattr(value, "tobytes"):  # numpy array or scalar
        if value.shape == ():
            return value.item()
        return (tuple(value.shape), str(value.dtype), value.tobytes())
    if isinstance(value, dict):
        return tuple(sorted((str(k), to_hashable(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(to_hashable(v) for v in value)
    hash(value)
    return value


class GymTextEnv:
    """A Gymnasium env with a ``Discrete`` action space, behind the arborl contract.

    Args:
        env_or_id: A ``gymnasium.Env`` instance, or an id for ``gymnasium.make``.
        action_names: One word per action index (``n`` of them); default ``"0"``..``"n-1"``
            (the action values, when the space has a nonzero ``start``).
        render_obs: Turns a raw observation into the text the model reads; default ``str``.
        success_fn: ``(obs, reward, terminated, truncated, info) -> bool`` for the final step;
            default: see the module docstring.
        **make_kwargs: Passed to ``gymnasium.make`` when ``env_or_id`` is an id.

    Raises:
        TypeError: The action space is not ``Discrete``.
        ValueError: ``action_names`` has the wrong length.
    """

    def __init__(
        self,
        env_or_id: Any,
        *,
        action_names: Sequence[str] | None = None,
        render_obs: Callable[[Any], str] | None = None,
        success_fn: SuccessFn | None = None,
        **make_kwargs: Any,
    ) -> None:
        import gymnasium  # optional dependency: the `gym` extra

        if isinstance(env_or_id, str):
            env = gymnasium.make(env_or_id, **make_kwargs)
        elif make_kwargs:
            raise TypeError(f"GymTextEnv: keyword arguments {sorted(make_kwargs)} only apply when passing an env id.")
        else:
            env = env_or_id
        space = env.action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise TypeError(
                f"GymTextEnv: action space {space!r} is not Discrete; text actions need a finite set of "
                "names. Wrap the env so its actions are Discrete (e.g. a gymnasium.ActionWrapper that "
                "maps an index to a value) and pass action_names."
            )
        n, start = int(space.n), int(space.start)
        names = [str(start + i) for i in range(n)] if action_names is None else [str(a) for a in action_names]
        if len(names) != n:
            raise ValueError(f"GymTextEnv: {len(names)} action_names for a Discrete({n}) space; give exactly {n}.")
        self.env, self.actions, self._start = env, tuple(names), start
        self._render = render_obs or str
        self._success = success_fn or _default_success
        spec = getattr(env, "spec", None)
        self.task_type = f"gym:{spec.id}" if spec is not None else type(env).__name__
        self._obs: Any = None
        self._reset_done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Reset the wrapped env; returns its ``(obs, info)`` (info copied)."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._obs, self._reset_done = obs, True
        return obs, dict(info)

    def step(self, action: str) -> StepResult:
        """Parse the model's text and step the wrapped env; never raises on malformed text."""
        if not self._reset_done:
            raise RuntimeError("GymTextEnv: call reset() before step().")
        name = extract_action(action, self.actions)
        if name is None:
            error = invalid_message(action, self.actions)
            return StepResult(self._obs, 0.0, False, False, {"action_valid": False, "action": None, "error": error})
        index = self.actions.index(name)
        obs, reward, terminated, truncated, env_info = self.env.step(self._start + index)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        if not math.isfinite(reward):
            raise ValueError(f"GymTextEnv: the wrapped env returned reward {reward}; it must be finite.")
        info = dict(env_info)
        info.update(action_valid=True, action=name)
        if terminated or truncated:
            info["success"] = bool(self._success(obs, reward, terminated, truncated, info))
        self._obs = obs
        return StepResult(obs, reward, terminated, truncated, info)

    def format_observation(self, obs: Any) -> str:
        """``render_obs(obs)`` (``str(obs)`` by default)."""
        return self._render(obs)

    def state_key(self) -> Hashable:
        """A hashable copy of the last observation (see :func:`to_hashable`)."""
        if not self._reset_done:
            raise RuntimeError("GymTextEnv: call reset() before state_key().")
        return to_hashable(self._obs)

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()
