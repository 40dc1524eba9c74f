"""Observation type and text renderings shared by the grid environments (FrozenLake, Sokoban).

Two renderings, chosen per env with ``obs_format``:

* ``"rows"`` (default): one whitespace-separated word per grid row, prefixed by its row index,
  e.g. ``0:P_H_ 1:____ 2:_H__ 3:___G``. Built for tiny word-level tokenizers: a 2-layer model
  reads a row as one token whose embedding carries the row's position, which learned far
  better than one token per cell. When the last step needs a comment, one status word comes
  first (``invalid``, ``goal``, ``hole``, ``solved``, ``timeout``, ``ended``); an ordinary step
  has no prefix, so the vocabulary stays small.
* ``"rows+cols"``: the ``rows`` words followed by one word per column (``c0:<column read top to
  bottom>`` ...). Every cell appears twice, so the cells above and below the player sit in one
  token just as the cells left and right of it do; a 2-layer model then reads "is there a hole
  next to me" from two tokens instead of relating characters across row tokens.
* ``"grid"``: a multi-line grid with a legend, the status sentence and the valid actions, for
  real LLMs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from arborl.env.base import StepResult
from arborl.env.parsing import extract_action, invalid_message

OBS_FORMATS = ("rows", "rows+cols", "grid")

STATUS_WORDS = ("", "invalid", "goal", "hole", "solved", "timeout", "ended")
"""Status of the step that produced an observation; ``""`` is an ordinary step."""


@dataclass(frozen=True)
class GridObs:
    """What a grid env's ``reset``/``step`` return as ``obs``.

    Attributes:
        rows: The grid as symbol strings, player drawn in.
        status: One of :data:`STATUS_WORDS`.
        message: A sentence for people and LLMs saying what happened (``""`` when nothing to say).
    """

    rows: tuple[str, ...]
    status: str = ""
    message: str = ""


def check_obs_format(obs_format: str, env_name: str) -> None:
    """Raise ``ValueError`` naming the choices when ``obs_format`` is unknown."""
    if obs_format not in OBS_FORMATS:
        raise ValueError(
            f"{env_name}: obs_format={obs_format!r} is unknown; use one of {list(OBS_FORMATS)} "
            "('rows' or 'rows+cols' for tiny word-level tokenizers, 'grid' for LLMs)."
        )


def render_rows(obs: GridObs, *, with_cols: bool = False) -> str:
    """The ``"rows"`` rendering ``[status] 0:<row0> 1:<row1> ...``, plus ``c0:<col0> ...`` if ``with_cols``."""
    words = [f"{i}:{row}" for i, row in enumerate(obs.rows)]
    if with_cols and obs.rows:
        words += [f"c{j}:{''.join(row[j] for row in obs.rows)}" for j in range(len(obs.rows[0]))]
    if obs.status:
        words.insert(0, obs.status)
    return " ".join(words)


def render_grid(obs: GridObs, *, intro: str, legend: str, actions: Sequence[str]) -> str:
    """The ``"grid"`` rendering: intro, legend, optional status sentence, grid, action list."""
    lines = [intro, f"Legend: {legend}."]
    if obs.message:
        lines.append(obs.message)
    lines.extend(" ".join(row) for row in obs.rows)
    lines.append(
        f"Valid actions: {', '.join(actions)}. Reply with exactly one action, "
        f"e.g. <answer>{actions[0]}</answer>."
    )
    return "\n".join(lines)


HELDOUT_SEED_START = 1_000_000
"""First seed of the held-out evaluation range; train on seeds below it."""

HELDOUT_FRACTION = 8
"""One map in this many (by hash) belongs to the held-out part."""


def in_heldout_part(fingerprint: str) -> bool:
    """Whether a map belongs to the held-out part of the map space (1 in ``HELDOUT_FRACTION``, by hash).

    Small grids repeat maps across seeds (measured: 241 of 512 held-out 4x4 FrozenLake maps also
    came from the first 100k training seeds), so a seed range alone does not keep evaluation maps
    out of training. Generators partition the map space instead: seeds below the held-out start
    only yield training-part maps, seeds from it only held-out-part maps.
    """
    digest = hashlib.sha256(fingerprint.encode()).digest()
    return digest[0] % HELDOUT_FRACTION == 0


def wants_heldout(seed: int, heldout_seed_start: int | None) -> bool | None:
    """Which part a seed must draw from: True/False, or None when partitioning is off."""
    return None if heldout_seed_start is None else seed >= heldout_seed_start


class _GridState(Protocol):
    _done: bool
    _success: bool
    _steps: int
    _last_obs: GridObs
    max_steps: int

    def _obs(self, status: str, message: str) -> GridObs: ...


def begin_step(env: _GridState, action: str, actions: Sequence[str]) -> tuple[str | None, StepResult | None]:
    """The part of ``step`` every grid env shares: count the step, parse the action.

    Returns ``(name, None)`` for a valid action (the env then applies it), or ``(None, result)``
    when the step is already answered: malformed text (the state stays, the step counts, and the
    last allowed step truncates). Steps after the end never reach the env
    (:class:`arborl.env.wrappers.EpisodeGuard` answers them).
    """
    env._steps += 1
    name = extract_action(action, actions)
    if name is not None:
        return name, None
    out_of_steps = env._steps >= env.max_steps
    message = invalid_message(action, actions)
    info: dict[str, Any] = {"action_valid": False, "action": None, "error": message}
    if out_of_steps:
        env._done, env._success = True, False
        info["success"] = False
    env._last_obs = env._obs("timeout" if out_of_steps else "invalid", message)
    return None, StepResult(env._last_obs, 0.0, False, out_of_steps, info)


def begin_reset(
    seed_rng: Any, seed: int | None, options: dict[str, Any] | None, *, option: str, env_name: str
) -> tuple[int, dict[str, Any]]:
    """The part of ``reset`` every grid env shares: check ``options``, pick or re-seed the seed stream.

    ``reset(seed=s)`` followed by ``reset()`` replays the same sequence, as in Gymnasium.
    Returns the seed to play and a copy of ``options``.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - {option})
    if unknown:
        raise ValueError(f"{env_name}.reset: unknown options {unknown}; the only option is {option!r}.")
    if seed is None:
        return seed_rng.getrandbits(31), options
    seed_rng.seed(f"arborl.{env_name.lower()}.seeds/{seed}")
    return seed, options
