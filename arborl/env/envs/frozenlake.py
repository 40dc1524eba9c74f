"""FrozenLake as a text environment: walk from S to G on an N x N lake without falling in a hole.

Follows Gymnasium's ``FrozenLake-v1`` dynamics (actions ``Left, Down, Right, Up``; a move off the
edge stays put; slippery ice moves in the intended direction with probability 1/3 and in each
perpendicular direction with 1/3), and departs from it in three ways:

* Maps are random per seed, and by default S and G are random cells too (``fixed_corners=True``
  gives Gymnasium's top-left start / bottom-right goal). With fixed corners a policy can score
  by always heading down-right; random ends force it to read the map.
* Every generated map has a path S -> G (regenerated until BFS finds one), and map generation is a
  pure function of its arguments. Seeds from ``heldout_seed_start`` on (default 1,000,000) give
  only maps of the held-out part of the map space and seeds below it only the rest, so training
  never meets an evaluation map (:func:`heldout_maps` lists the evaluation set).
* Observations are text (see :mod:`arborl.env.envs._grid` for the ``rows`` and ``grid`` formats);
  ``P`` is the player, ``H`` a hole, ``G`` the goal, ``_`` frozen ice (the start cell too).

Reward: 1 on reaching G (terminated, ``success=True``), 0 on falling in a hole (terminated,
``success=False``), 0 otherwise. ``max_steps`` (default ``2 * rows * cols``) truncates; invalid
actions use up a step too, so a model that never answers cannot loop forever.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from arborl.env.base import StepResult
from arborl.env.envs._grid import (
    HELDOUT_SEED_START,
    GridObs,
    begin_reset,
    begin_step,
    check_obs_format,
    in_heldout_part,
    render_grid,
    render_rows,
    wants_heldout,
)

ACTIONS = ("Left", "Down", "Right", "Up")
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (drow, dcol) per action index, Gymnasium's order
_MAX_MAP_ATTEMPTS = 10_000

Cell = tuple[int, int]


def _check_map_params(size: int, hole_prob: float) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or size < 2:
        raise ValueError(f"FrozenLake: size={size!r} must be an int >= 2 (the lake is size x size).")
    if not 0.0 <= hole_prob < 1.0:
        raise ValueError(f"FrozenLake: hole_prob={hole_prob!r} must be in [0, 1); 0.2 is Gymnasium's default.")


def map_fingerprint(desc: Sequence[str]) -> str:
    """A map's identity as one string (rows joined by ``/``), used in ``state_key``."""
    return "/".join(desc)


def _find(desc: Sequence[str], symbol: str) -> Cell:
    for r, row in enumerate(desc):
        c = row.find(symbol)
        if c >= 0:
            return r, c
    raise ValueError(f"FrozenLake map has no {symbol!r} cell")


def _step_cell(desc: Sequence[str], cell: Cell, action: int) -> Cell:
    """Where ``action`` leads from ``cell``; moving off the edge stays put (as in Gymnasium)."""
    r, c = cell[0] + _MOVES[action][0], cell[1] + _MOVES[action][1]
    if 0 <= r < len(desc) and 0 <= c < len(desc[0]):
        return r, c
    return cell


@lru_cache(maxsize=4096)
def _distances_to_goal(desc: tuple[str, ...]) -> dict[Cell, int]:
    """Shortest number of moves from each cell to G, avoiding holes (BFS from G; moves are symmetric)."""
    goal = _find(desc, "G")
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        cell = queue.popleft()
        for action in range(4):
            nxt = _step_cell(desc, cell, action)
            if nxt not in dist and desc[nxt[0]][nxt[1]] != "H":
                dist[nxt] = dist[cell] + 1
                queue.append(nxt)
    return dist


def generate_map(
    seed: int,
    *,
    size: int = 4,
    hole_prob: float = 0.2,
    fixed_corners: bool = False,
    heldout_seed_start: int | None = HELDOUT_SEED_START,
) -> tuple[str, ...]:
    """A random ``size x size`` map with a path from S to G; a pure function of its arguments.

    Args:
        seed: Any int; the same arguments always give the same map (independent of global state,
            ``PYTHONHASHSEED`` and platform).
        size: Side length.
        hole_prob: Probability that a cell other than S/G is a hole.
        fixed_corners: S at the top-left and G at the bottom-right (Gymnasium's layout) instead
            of two random distinct cells.
        heldout_seed_start: Seeds from here on draw from the held-out part of the map space,
            seeds below it from the training part (see :func:`~arborl.env.envs._grid.in_heldout_part`);
            ``None`` turns the partition off.

    Returns:
        Rows in Gymnasium's letters: ``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"generate_map: seed must be an int, got {type(seed).__name__}.")
    _check_map_params(size, hole_prob)
    rng = random.Random(f"arborl.frozenlake/{size}/{hole_prob!r}/{int(fixed_corners)}/{seed}")
    part = wants_heldout(seed, heldout_seed_start)
    for _ in range(_MAX_MAP_ATTEMPTS):
        grid = [["H" if rng.random() < hole_prob else "F" for _ in range(size)] for _ in range(size)]
        if fixed_corners:
            start, goal = (0, 0), (size - 1, size - 1)
        else:
            a, b = rng.sample(range(size * size), 2)
            start, goal = divmod(a, size), divmod(b, size)
        grid[start[0]][start[1]] = "S"
        grid[goal[0]][goal[1]] = "G"
        desc = tuple("".join(row) for row in grid)
        if part is not None and in_heldout_part(map_fingerprint(desc)) != part:
            continue
        if start in _distances_to_goal(desc):
            return desc
    raise RuntimeError(
        f"generate_map: no map with a path S->G in {_MAX_MAP_ATTEMPTS} tries (size={size}, "
        f"hole_prob={hole_prob}, heldout_seed_start={heldout_seed_start}); lower hole_prob, or pass "
        "heldout_seed_start=None when the map space is too small to split."
    )


def heldout_maps(
    n: int = 512,
    *,
    heldout_seed_start: int = HELDOUT_SEED_START,
    size: int = 4,
    hole_prob: float = 0.2,
    fixed_corners: bool = False,
) -> list[tuple[int, tuple[str, ...]]]:
    """``n`` distinct evaluation maps from seeds ``heldout_seed_start, heldout_seed_start + 1, ...``.

    Seeds whose map repeats an earlier one in the set are skipped, so the result always has
    ``n`` different maps, and none of them can come from a training seed (below
    ``heldout_seed_start``) of an env built with the same settings.

    Returns:
        ``(seed, desc)`` pairs; ``env.reset(seed=seed)`` with matching settings plays ``desc``.
    """
    out: list[tuple[int, tuple[str, ...]]] = []
    seen: set[tuple[str, ...]] = set()
    seed = heldout_seed_start
    while len(out) < n:
        desc = generate_map(seed, size=size, hole_prob=hole_prob, fixed_corners=fixed_corners,
                            heldout_seed_start=heldout_seed_start)
        if desc not in seen:
            seen.add(desc)
            out.append((seed, desc))
        seed += 1
    return out


def _validate_desc(desc: Any) -> tuple[str, ...]:
    """Check an explicit map passed through ``reset(options={"desc": ...})``."""
    rows = tuple(desc) if isinstance(desc, list | tuple) else ()
    ok = bool(rows) and all(isinstance(r, str) and r and len(r) == len(rows[0]) for r in rows)
    text = "".join(rows) if ok else ""
    if not ok or set(text) - set("SFHG") or text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(
            f"FrozenLake: options['desc']={desc!r} is not a map; pass equal-length row strings over "
            "'S','F','H','G' with exactly one S and one G, e.g. ['SFFF', 'FHFH', 'FFFH', 'HFFG']."
        )
    return rows


@lru_cache(maxsize=4096)
def _greedy_actions(desc: tuple[str, ...]) -> dict[Cell, int]:
    """Non-slippery expert: per cell, the first action (in ``ACTIONS`` order) on a shortest path."""
    dist = _distances_to_goal(desc)
    table: dict[Cell, int] = {}
    for cell, d in dist.items():
        for action in range(4):
            if d > 0 and dist.get(_step_cell(desc, cell, action)) == d - 1:
                table[cell] = action
                break
    return table


@lru_cache(maxsize=1024)
def _slippery_policy(desc: tuple[str, ...], horizon: int) -> tuple[dict[Cell, int], ...]:
    """Finite-horizon value iteration maximising P(reach G within the remaining steps).

    ``policy[k][cell]`` is the best action with ``k + 1`` steps left. Planning to the step limit
    (not an infinite horizon) is what "optimal" means when the episode truncates, and it breaks
    the ties an undiscounted infinite-horizon policy has between safe-but-idle and safe-and-useful moves.
    """
    cells = [(r, c) for r in range(len(desc)) for c in range(len(desc[0])) if desc[r][c] in "SF"]
    # outcome of landing on a cell: 1 at G, 0 in a hole, else the value with fewer steps left
    value = {cell: 0.0 for cell in cells}
    policy: list[dict[Cell, int]] = []
    for _ in range(horizon):
        new_value: dict[Cell, float] = {}
        best_actions: dict[Cell, int] = {}
        for cell in cells:
            best, best_q = 0, -1.0
            for action in range(4):
                q = 0.0
                for slip in (-1, 0, 1):
                    nr, nc = _step_cell(desc, cell, (action + slip) % 4)
                    symbol = desc[nr][nc]
                    q += 1.0 if symbol == "G" else (0.0 if symbol == "H" else value[(nr, nc)])
                if q > best_q + 1e-12:
                    best, best_q = action, q
            new_value[cell], best_actions[cell] = best_q / 3.0, best
        value = new_value
        policy.append(best_actions)
    return tuple(policy)


class FrozenLake:
    """Text FrozenLake on random maps (see the module docstring for rules and rewards).

    Args:
        size: Side length of generated maps.
        hole_prob: Probability that a generated cell is a hole.
        is_slippery: Gymnasium's slippery ice (intended move with probability 1/3, each
            perpendicular move 1/3); draws come from a generator seeded by ``reset(seed=...)``.
        max_steps: Steps (valid or not) before truncation; ``None`` means ``2 * rows * cols``.
        obs_format: ``"rows"`` / ``"rows+cols"`` (tiny tokenizers) or ``"grid"`` (LLMs).
        fixed_corners: Start top-left and goal bottom-right instead of random cells.
        heldout_seed_start: Seeds from here on play held-out maps only, seeds below it training
            maps only; ``None`` turns the split off. Keep it equal to the trainer's eval seed start.
        progress_reward: Per-step shaping ``c * (d(s) - d(s'))`` with ``d`` the shortest-path
            distance to G (a step closer earns ``+c``, a step away ``-c``, a bump 0, a hole
            ``-c``). It is potential-based (Ng et al. 1999, with ``phi = -c * d``), so it leaves the
            optimal policy unchanged while telling each turn whether it helped; 0 turns it off.

    ``reset(options={"desc": ["SFFF", ...]})`` plays an explicit map instead of a generated one.
    """

    task_type = "frozenlake"
    actions = ACTIONS

    def __init__(
        self,
        *,
        size: int = 4,
        hole_prob: float = 0.2,
        is_slippery: bool = False,
        max_steps: int | None = None,
        obs_format: str = "rows",
        fixed_corners: bool = False,
        heldout_seed_start: int | None = HELDOUT_SEED_START,
        progress_reward: float = 0.0,
    ) -> None:
        _check_map_params(size, hole_prob)
        check_obs_format(obs_format, "FrozenLake")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"FrozenLake: max_steps={max_steps!r} must be a positive int or None.")
        self.size, self.hole_prob, self.is_slippery = size, hole_prob, is_slippery
        self.obs_format, self.fixed_corners = obs_format, fixed_corners
        self.heldout_seed_start = heldout_seed_start
        self.progress_reward = float(progress_reward)
        self._max_steps_arg = max_steps
        self.max_steps = max_steps if max_steps is not None else 2 * size * size
        self._seed_rng = random.Random()  # draws the seed of a reset(seed=None)
        self._slip_rng = random.Random(0)
        self._desc: tuple[str, ...] = ()
        self._base_rows: list[str] = []
        self._pos: Cell = (0, 0)
        self._steps = 0
        self._done = False
        self._success = False
        self._last_obs = GridObs(rows=())

    @property
    def deterministic(self) -> bool:
        """Whether transitions are deterministic (``check_env`` then expects the expert to succeed)."""
        return not self.is_slippery

    @property
    def desc(self) -> tuple[str, ...]:
        """The current map in Gymnasium's letters (``S F H G``)."""
        return self._desc

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[GridObs, dict]:
        """Start an episode on the map of ``seed`` (or ``options["desc"]``).

        Returns:
            ``(obs, info)`` with ``info = {"seed": ..., "desc": ...}``.
        """
        seed, options = begin_reset(self._seed_rng, seed, options, option="desc", env_name="FrozenLake")
        if "desc" in options:
            desc = _validate_desc(options["desc"])
        else:
            desc = generate_map(seed, size=self.size, hole_prob=self.hole_prob, fixed_corners=self.fixed_corners,
                                heldout_seed_start=self.heldout_seed_start)
        self._desc = desc
        self._fingerprint = map_fingerprint(desc)
        self._base_rows = [row.replace("S", "_").replace("F", "_") for row in desc]
        self.max_steps = self._max_steps_arg if self._max_steps_arg is not None else 2 * len(desc) * len(desc[0])
        self._pos = _find(desc, "S")
        self._slip_rng.seed(f"arborl.frozenlake.slip/{seed}")
        self._steps, self._done, self._success = 0, False, False
        self._last_obs = self._obs("", "")
        return self._last_obs, {"seed": seed, "desc": desc}

    def step(self, action: str) -> StepResult:
        """Apply the model's text; never raises on malformed text (see :mod:`arborl.env.base`)."""
        self._require_reset()
        name, answered = begin_step(self, action, ACTIONS)
        if answered is not None:
            return answered
        out_of_steps = self._steps >= self.max_steps
        move = ACTIONS.index(name)
        if self.is_slippery:
            move = (move + self._slip_rng.randrange(3) - 1) % 4
        before = self._pos
        self._pos = _step_cell(self._desc, self._pos, move)
        symbol = self._desc[self._pos[0]][self._pos[1]]
        shaping = self._shaping(before, self._pos) if self.progress_reward else 0.0
        info = {"action_valid": True, "action": name, "moved": ACTIONS[move]}
        terminated = symbol in "GH"
        truncated = out_of_steps and not terminated
        if symbol == "G":
            status, message = "goal", "You reached the goal."
        elif symbol == "H":
            status, message = "hole", "You fell into a hole."
        elif truncated:
            status, message = "timeout", f"Out of steps ({self.max_steps})."
        else:
            status = ""
            message = f"You slipped and moved {ACTIONS[move]}." if move != ACTIONS.index(name) else ""
        if terminated or truncated:
            self._end(info, success=symbol == "G")
        self._last_obs = self._obs(status, message)
        return StepResult(self._last_obs, (1.0 if symbol == "G" else 0.0) + shaping, terminated, truncated, info)

    def _shaping(self, before: Cell, after: Cell) -> float:
        dist = _distances_to_goal(self._desc)
        if after not in dist:  # a hole
            return -self.progress_reward
        return self.progress_reward * (dist[before] - dist[after])

    def format_observation(self, obs: GridObs) -> str:
        """Render ``obs`` in this env's ``obs_format``."""
        if self.obs_format in ("rows", "rows+cols"):
            return render_rows(obs, with_cols=self.obs_format == "rows+cols")
        rows, cols = len(obs.rows), len(obs.rows[0]) if obs.rows else 0
        slip = " The ice is slippery: a move may slide you sideways." if self.is_slippery else ""
        intro = f"FrozenLake {rows}x{cols}. Walk to the goal G without stepping into a hole H.{slip}"
        return render_grid(obs, intro=intro, legend="P = you, G = goal, H = hole, _ = frozen ice", actions=ACTIONS)

    def state_key(self) -> tuple[str, int, int]:
        """``(map fingerprint, player row, player col)``: equal across episodes on the same map."""
        self._require_reset()
        return self._fingerprint, self._pos[0], self._pos[1]

    def expert_action(self) -> str:
        """A shortest-path action (non-slippery) or the success-maximising one (slippery).

        Returns ``ACTIONS[0]`` when no action helps (episode over, or G unreachable from here).
        """
        self._require_reset()
        if self._done:
            return ACTIONS[0]
        if self.is_slippery:
            steps_left = self.max_steps - self._steps
            return ACTIONS[_slippery_policy(self._desc, self.max_steps)[steps_left - 1].get(self._pos, 0)]
        return ACTIONS[_greedy_actions(self._desc).get(self._pos, 0)]

    def close(self) -> None:
        """Nothing to release; present for the contract."""

    def _end(self, info: dict[str, Any], *, success: bool) -> None:
        self._done, self._success = True, success
        info["success"] = success

    def _obs(self, status: str, message: str) -> GridObs:
        rows = list(self._base_rows)
        r, c = self._pos
        rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
        return GridObs(rows=tuple(rows), status=status, message=message)

    def _require_reset(self) -> None:
        if not self._desc:
            raise RuntimeError("FrozenLake: call reset() before step(), state_key() or expert_action().")
