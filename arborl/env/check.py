"""``check_env``: a conformance checker for the contract in :mod:`arborl.env.base`.

Run it on every environment before training on it (as SB3's ``env_checker`` does for Gym
envs). Each failed check raises :class:`EnvCheckError` whose message names the method, what was
expected, what happened and how to fix it. The checks, in order:

1. ``reset`` takes keyword-only ``seed`` and ``options`` with defaults and returns ``(obs, dict)``.
2. ``format_observation`` returns ``str`` or a list of ``{"role", "content"}`` dicts.
3. ``state_key()`` is hashable; the same seed gives the same formatted observation and an equal
   key with an equal hash (determinism). Different seeds may differ.
4. Garbage actions (``"%%% not an action"``, ``""``) do not raise, return a :class:`StepResult`
   with ``info["action_valid"] is False``, reward 0, a non-empty ``info["error"]``, and leave
   ``state_key()`` unchanged.
5. ``n_steps`` random valid actions (from ``env.actions`` when present): every result has a
   finite float reward, bool ``terminated``/``truncated``, a dict ``info`` with bool
   ``action_valid``; when an episode ends, ``info["success"]`` is a bool.
6. When ``expert_action`` exists and the env is deterministic (``env.deterministic`` is not
   False), following it from ``reset(seed)`` ends with ``info["success"] is True`` within
   ``env.max_steps`` (or 1,000) steps.
7. ``close()`` does not raise.

What happens on a step after the episode ended is not the env's business: arborl drives every
env through :class:`arborl.env.wrappers.EpisodeGuard`, which answers such a step itself, so
``check_env`` never takes one.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from typing import Any

from arborl.env.base import StepResult

GARBAGE_ACTIONS = ("%%% not an action", "")
_DEFAULT_EXPERT_LIMIT = 1_000


class EnvCheckError(Exception):
    """An environment breaks the arborl env contract; the message says where and how to fix it."""


def _fail(method: str, expected: str, got: str, fix: str) -> EnvCheckError:
    return EnvCheckError(f"{method}: expected {expected}; got {got}. Fix: {fix}")


def _call(method: str, fn: Callable[..., Any], *args: Any, fix: str, **kwargs: Any) -> Any:
    """Call an env method, turning an exception into an EnvCheckError that names the call."""
    try:
        return fn(*args, **kwargs)
    except EnvCheckError:
        raise
    except Exception as exc:
        raise _fail(method, "no exception", f"{type(exc).__name__}: {exc}", fix) from exc


def check_env(env: Any, *, seed: int = 0, n_steps: int = 20) -> None:
    """Check ``env`` against the arborl env contract (see the module docstring for the list).

    Args:
        env: The environment instance (it is reset, stepped and finally closed).
        seed: Seed for the resets the checker makes (also seeds its random action choice).
        n_steps: Random valid steps to take in check 5.

    Raises:
        EnvCheckError: The first broken rule, with the method name, expectation and fix.
    """
    _check_methods(env)
    _check_reset_signature(env)
    text = _format(env, _reset(env, seed)[0], "after reset")
    key = _state_key(env, "after reset")
    text2 = _format(env, _reset(env, seed)[0], "after reset")
    key2 = _state_key(env, "after a second reset")
    if text != text2:
        raise _fail(f"reset(seed={seed})", "the same observation for the same seed",
                    f"{text[:80]!r} then {text2[:80]!r}",
                    "derive every random choice from the seed (e.g. random.Random(seed)), not global state")
    if key != key2 or hash(key) != hash(key2):
        raise _fail("state_key", "equal keys with equal hashes for equal states (same seed)",
                    f"{key!r} then {key2!r}", "build the key from the state's values, not object identity")
    _reset(env, seed + 1)  # another seed may give another state; it must just work
    _reset(env, seed)
    for garbage in GARBAGE_ACTIONS:
        _check_invalid_step(env, garbage)
    _check_random_steps(env, seed, n_steps)
    _check_expert(env, seed)
    _call("close", env.close, fix="make close() idempotent and free only what the env opened")


_REQUIRED = {
    "reset": "def reset(self, *, seed=None, options=None) -> tuple[obs, dict]",
    "step": "def step(self, action: str) -> StepResult",
    "format_observation": "def format_observation(self, obs) -> str",
    "state_key": "def state_key(self) -> Hashable (a tuple describing the current state)",
    "close": "def close(self) -> None",
}


def _check_methods(env: Any) -> None:
    for name, signature in _REQUIRED.items():
        if not callable(getattr(env, name, None)):
            raise _fail(name, f"a method `{name}`", f"{type(env).__name__} has no callable `{name}`",
                        f"add `{signature}`")


def _check_reset_signature(env: Any) -> None:
    reset = env.reset
    params = inspect.signature(reset).parameters
    for name in ("seed", "options"):
        param = params.get(name)
        if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY or param.default is not None:
            raise _fail("reset", "keyword-only parameters `seed` and `options` defaulting to None",
                        f"signature reset{inspect.signature(reset)}",
                        "declare `def reset(self, *, seed: int | None = None, options: dict | None = None)` (note the bare `*`)")


def _reset(env: Any, seed: int) -> tuple[Any, dict]:
    out = _call(f"reset(seed={seed})", env.reset, seed=seed, options=None,
                fix="reset must accept seed/options keywords and not raise for a valid seed")
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise _fail(f"reset(seed={seed})", "a tuple (obs, info) with info a dict", f"{type(out).__name__} {out!r:.80}",
                    "return `obs, {}` (info may be empty but must be a dict)")
    return out


def _format(env: Any, obs: Any, when: str) -> str:
    """Format ``obs``, check its type, and return it as one comparable string."""
    text = _call(f"format_observation ({when})", env.format_observation, obs,
                 fix="format_observation must accept every obs that reset/step return")
    if isinstance(text, str):
        return text
    if isinstance(text, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in text
    ):
        return repr(text)
    raise _fail(f"format_observation ({when})", "a str or a list of {'role': str, 'content': ...} dicts",
                f"{type(text).__name__} {text!r:.80}", "return the text the model reads, or chat messages")


def _state_key(env: Any, when: str) -> Any:
    key = _call(f"state_key ({when})", env.state_key, fix="state_key must work after reset and after any step")
    try:
        hash(key)
    except TypeError as exc:
        raise _fail(f"state_key ({when})", "a hashable value", f"unhashable {type(key).__name__}",
                    "return a tuple of ints/strs (convert lists to tuples, arrays to (shape, bytes))") from exc
    return key


def _step(env: Any, action: str, *, context: str = "", fix: str = "") -> StepResult:
    where = f"step({action!r}){context}"
    res = _call(where, env.step, action,
                fix=fix or "step must never raise on model text: return info['action_valid']=False instead")
    if not isinstance(res, StepResult):
        raise _fail(where, "an arborl.env.StepResult", type(res).__name__, "return StepResult(obs, reward, ...)")
    if not isinstance(res.reward, float) or not math.isfinite(res.reward):
        raise _fail(where, "a finite float reward", f"{type(res.reward).__name__} {res.reward!r}",
                    "return float(reward) and never NaN/inf")
    for flag in ("terminated", "truncated"):
        if not isinstance(getattr(res, flag), bool):
            value = getattr(res, flag)
            raise _fail(where, f"a bool `{flag}`", f"{type(value).__name__} {value!r}", f"return bool({flag})")
    if not isinstance(res.info, dict) or not isinstance(res.info.get("action_valid"), bool):
        raise _fail(where, "info to be a dict with a bool 'action_valid'", f"{res.info!r:.80}",
                    "set info['action_valid'] = True/False on every step")
    if (res.terminated or res.truncated) and not isinstance(res.info.get("success"), bool):
        raise _fail(where, "info['success'] to be a bool when the episode ends",
                    f"{res.info.get('success')!r}", "set info['success'] = True/False on the final step")
    _format(env, res.obs, f"after {where}")
    return res


def _check_invalid_step(env: Any, garbage: str) -> None:
    before = _state_key(env, "before an invalid action")
    res = _step(env, garbage)
    where = f"step({garbage!r})"
    if res.info["action_valid"] is not False:
        raise _fail(where, "info['action_valid'] is False for text that is not an action", "True",
                    "parse with arborl.env.parsing.extract_action and reject None")
    if res.reward != 0.0:
        raise _fail(where, "reward 0.0 for an invalid action (the rollout applies the penalty)",
                    repr(res.reward), "return 0.0 and leave penalties to the rollout config")
    if not (isinstance(res.info.get("error"), str) and res.info["error"]):
        raise _fail(where, "a non-empty str info['error'] saying what was wrong", repr(res.info.get("error")),
                    "set info['error'] (and show it in the observation)")
    after = _state_key(env, f"after {where}")
    if after != before:
        raise _fail(where, "state_key unchanged by an invalid action", f"{before!r} -> {after!r}",
                    "return before changing any state when the action does not parse")


def _check_random_steps(env: Any, seed: int, n_steps: int) -> None:
    """Take random valid actions until ``n_steps`` or the end of an episode."""
    actions = list(getattr(env, "actions", None) or [])
    rng = random.Random(seed)
    for _ in range(n_steps if actions else 0):
        res = _step(env, rng.choice(actions))
        if res.terminated or res.truncated:
            return


def _check_expert(env: Any, seed: int) -> None:
    """Follow ``expert_action`` from ``reset(seed)`` to a successful end (deterministic envs only)."""
    expert = getattr(env, "expert_action", None)
    if not callable(expert) or getattr(env, "deterministic", True) is False:
        return
    _reset(env, seed)
    limit = int(getattr(env, "max_steps", _DEFAULT_EXPERT_LIMIT))
    res = None
    for i in range(limit):
        action = _call("expert_action", expert, fix="expert_action must work in every non-final state")
        if not isinstance(action, str):
            raise _fail("expert_action", "a str action", f"{type(action).__name__} {action!r}",
                        "return the action text the model would write")
        res = _step(env, action)
        if not res.info["action_valid"]:
            raise _fail("expert_action", "an action step() accepts", f"{action!r} rejected at step {i + 1}",
                        "return one of the env's action words")
        if res.terminated or res.truncated:
            break
    if res is None or res.info.get("success") is not True:
        state = "no final step" if res is None else f"terminated={res.terminated}, truncated={res.truncated}, success={res.info.get('success')!r}"
        raise _fail("expert_action", f"following it from reset(seed={seed}) to end with info['success'] True "
                    f"within {limit} steps", state,
                    "fix the planner, or set `deterministic = False` if transitions are random")
