"""The environment contract: Gymnasium's, adapted to text agents.

An environment knows nothing about models, tokens or training. The rollout calls::

    obs, info = env.reset(seed=..., options=...)
    text = env.format_observation(obs)          # what the model reads (str or chat messages)
    key = env.state_key()                        # hashable anchor state (GiGPO step groups)
    res = env.step(action_text)                  # the model's decoded output for the turn
    res.obs, res.reward, res.terminated, res.truncated, res.info

``step`` receives the model's text for the turn and parses it itself (helpers in
:mod:`arborl.env.parsing`). It must never raise on a malformed action: it returns
``info["action_valid"] = False`` and an observation that says what was wrong, and the rollout
applies the configured invalid-action penalty. ``terminated`` (the task reached an end state)
and ``truncated`` (a budget ran out) are kept apart, as in Gymnasium.

The env's own reward for an invalid action is 0 and its ``state_key()`` does not change (an
env may still count the turn against its step limit). At the end of an episode
``info["success"]`` is a bool.

An env only has to play one episode at a time: what a step after the end (``terminated`` or
``truncated`` was returned) gets back is not its business. arborl drives every env through
:class:`arborl.env.wrappers.EpisodeGuard`, which answers such a step itself (the final
observation again, reward ``0.0``, ``truncated=True``, ``info["action_valid"] = False``, an
``info["error"]`` saying to call ``reset()``) without calling the env.

Optional attributes the rest of arborl uses when present:

* ``expert_action() -> str``: an action text an expert would take now (``synth`` uses it).
* ``task_type: str`` attribute: capability bucket for the store (default: the class name).
* ``actions: Sequence[str]``: the valid action words, when the action set is finite.
* ``deterministic: bool``: ``False`` when transitions are random (default ``True``).
* ``max_steps: int``: the env's own step limit (``truncated`` when reached).

:func:`arborl.env.check.check_env` checks all of the above on an env instance.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class StepResult:
    """What ``Env.step`` returns.

    Attributes:
        obs: The next observation (any type ``format_observation`` understands).
        reward: Scalar step reward (finite).
        terminated: A terminal state of the task was reached (success or failure).
        truncated: The episode was cut short by a limit inside the env.
        info: Extras. Keys arborl reads: ``action_valid`` (bool), ``success`` (bool, at the end),
            ``action`` (the parsed action), ``error`` (text), ``media`` (list of MediaRef).
    """

    obs: Any
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """Structural type of an arborl environment (no base class needed)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Start an episode; returns ``(observation, info)``."""

    def step(self, action: str) -> StepResult:
        """Apply the model's text as an action; never raises on text that is not an action."""

    def format_observation(self, obs: Any) -> str | list[dict[str, Any]]:
        """Render an observation as the text (or content parts) the model reads."""

    def state_key(self) -> Hashable:
        """A hashable key of the current state: equal keys mean the same decision point."""

    def close(self) -> None:
        """Release what the env holds; called once when arborl is done with it."""
