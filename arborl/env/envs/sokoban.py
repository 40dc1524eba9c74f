"""Sokoban as a text environment: push every box onto a target.

Rooms are generated per seed as gym-sokoban and RAGEN do it: random interior walls on a
bordered room, boxes placed on their targets (the solved state), then the player plays *pulls*
backwards from there and the visited state with the largest total box displacement is kept.
Every pull is the reverse of a legal push, so that room is solvable. Departures from
gym-sokoban: a random reverse walk instead of its depth-first search over reverse moves
(cheaper; rooms come out easier: 6x6 rooms need 1-15 moves, mean 5.6, with one box and
1-20, mean 6.9, with two), and a BFS solver over
``(player, boxes)`` states that confirms every room and gives its optimal plan length. Rooms
already solved, beyond the solver's node budget, or needing more than ``max_steps`` moves are
rejected; generation gives up after ``max_gen_attempts`` rooms with a clear error, so its time is
bounded. Generation is a pure function of its arguments, and as in FrozenLake seeds from
``heldout_seed_start`` on only give rooms of the held-out part of the room space, seeds below it
only the rest.

Symbols (the ``rows`` and ``grid`` formats of :mod:`arborl.env.envs._grid`, and
``reset(options={"room": [...]})``): ``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
``V`` box on target, ``P`` player, ``S`` player on target.

Actions ``Up, Down, Left, Right``. Walking into a wall, or pushing a box into a wall or another
box, is a valid no-op. Reward: +1 when every box is on a target (terminated, ``success=True``);
optional shaping ``box_reward`` (+r when a box lands on a target, -r when one leaves it; default
0); 0 otherwise. ``max_steps`` truncates (invalid actions use up a step too).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
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

ACTIONS = ("Up", "Down", "Left", "Right")
_SYMBOLS = "#_OXVPS"
_ROOM_EXAMPLE = "['#####', '#P_X_O#'...] e.g. ['######', '#P_XO#', '######']"

# A state is (player cell, box cells); cells are flat indices row * width + col.
State = tuple[int, frozenset[int]]


def _deltas(width: int) -> tuple[int, int, int, int]:
    return (-width, width, -1, 1)  # Up, Down, Left, Right


def _dead_cells(walls: frozenset[int], targets: frozenset[int], height: int, width: int) -> frozenset[int]:
    """Floor cells that are not targets and sit in a corner: a box pushed there can never leave."""
    dead = set()
    for cell in range(width, (height - 1) * width):
        if cell in walls or cell in targets or cell % width in (0, width - 1):
            continue
        vertical = cell - width in walls or cell + width in walls
        horizontal = cell - 1 in walls or cell + 1 in walls
        if vertical and horizontal:
            dead.add(cell)
    return frozenset(dead)


def solve(
    walls: frozenset[int],
    targets: frozenset[int],
    height: int,
    width: int,
    start: State,
    *,
    max_nodes: int = 200_000,
) -> list[int] | None:
    """Shortest action plan (indices into ``ACTIONS``) that puts every box on a target.

    Breadth-first search over ``(player, boxes)`` states with corner-deadlock pruning.

    Returns:
        The plan (``[]`` if already solved), or ``None`` when no plan exists or the search
        visited more than ``max_nodes`` states.
    """
    if start[1] <= targets:
        return []
    deltas = _deltas(width)
    dead = _dead_cells(walls, targets, height, width)
    parent: dict[State, tuple[State, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        for action, delta in enumerate(deltas):
            nxt = player + delta
            if nxt in walls:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = nxt + delta
                if beyond in walls or beyond in boxes or beyond in dead:
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            child = (nxt, new_boxes)
            if child in parent:
                continue
            parent[child] = (state, action)
            if new_boxes <= targets:
                return _backtrack(parent, child)
            if len(parent) > max_nodes:
                return None
            queue.append(child)
    return None


def _backtrack(parent: dict[State, tuple[State, int] | None], state: State) -> list[int]:
    plan = []
    link = parent[state]
    while link is not None:
        state, action = link
        plan.append(action)
        link = parent[state]
    return plan[::-1]


def parse_room(rows: Sequence[str]) -> tuple[int, int, frozenset[int], frozenset[int], State]:
    """Read a room written in this module's symbols.

    Returns:
        ``(height, width, walls, targets, (player, boxes))``.

    Raises:
        ValueError: Not a rectangle of known symbols, no single player, box/target counts differ,
            or the border is not all wall.
    """
    rows = tuple(rows) if isinstance(rows, list | tuple) else ()
    ok = len(rows) >= 3 and all(isinstance(r, str) and len(r) == len(rows[0]) >= 3 for r in rows)
    text = "".join(rows) if ok else ""
    if not ok or set(text) - set(_SYMBOLS):
        raise ValueError(f"Sokoban: room {rows!r} is not a rectangle over {_SYMBOLS!r}; pass rows like {_ROOM_EXAMPLE}.")
    height, width = len(rows), len(rows[0])
    walls = frozenset(i for i, s in enumerate(text) if s == "#")
    targets = frozenset(i for i, s in enumerate(text) if s in "OVS")
    boxes = frozenset(i for i, s in enumerate(text) if s in "XV")
    players = [i for i, s in enumerate(text) if s in "PS"]
    border = {i for i in range(height * width) if i < width or i >= (height - 1) * width or i % width in (0, width - 1)}
    problems = []
    if len(players) != 1:
        problems.append(f"{len(players)} players (want exactly one 'P' or 'S')")
    if not boxes or len(boxes) != len(targets):
        problems.append(f"{len(boxes)} boxes and {len(targets)} targets (want the same number, at least 1)")
    if not border <= walls:
        problems.append("the border is not all '#' (the player must not walk off the grid)")
    if problems:
        raise ValueError(f"Sokoban: room {rows!r} has {'; '.join(problems)}.")
    return height, width, walls, targets, (players[0], boxes)


def render_room(height: int, width: int, walls: frozenset[int], targets: frozenset[int], state: State) -> tuple[str, ...]:
    """The room as symbol rows (inverse of :func:`parse_room`)."""
    player, boxes = state
    cells = []
    for i in range(height * width):
        if i in walls:
            cells.append("#")
        elif i == player:
            cells.append("S" if i in targets else "P")
        elif i in boxes:
            cells.append("V" if i in targets else "X")
        else:
            cells.append("O" if i in targets else "_")
    return tuple("".join(cells[r * width : (r + 1) * width]) for r in range(height))


def _connected(floor: set[int], width: int) -> bool:
    start = next(iter(floor))
    seen, stack = {start}, [start]
    while stack:
        cell = stack.pop()
        for delta in _deltas(width):
            nxt = cell + delta
            if nxt in floor and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return len(seen) == len(floor)


def _topology(rng: random.Random, height: int, width: int, num_boxes: int) -> tuple[frozenset[int], list[int]] | None:
    """Border walls plus a few random interior walls; ``None`` if the floor splits or is too small."""
    interior = [r * width + c for r in range(1, height - 1) for c in range(1, width - 1)]
    extra = set(rng.sample(interior, rng.randint(0, len(interior) // 5)))
    floor = [cell for cell in interior if cell not in extra]
    if len(floor) < 2 * num_boxes + 2 or not _connected(set(floor), width):
        return None
    walls = frozenset(i for i in range(height * width) if i not in set(floor))
    return walls, floor


def _reverse_play(rng: random.Random, walls: frozenset[int], targets: list[int], player: int, width: int, n_moves: int) -> State | None:
    """Walk backwards from the solved room, sometimes pulling the box behind the player.

    Keeps the visited state whose boxes are farthest (sum of Manhattan distances) from their own
    targets; ``None`` if no box ever left its target.
    """
    boxes = list(targets)
    best, best_score = None, 0
    for _ in range(n_moves):
        delta = rng.choice(_deltas(width))
        nxt = player + delta
        if nxt in walls or nxt in boxes:
            continue
        behind = player - delta
        if behind in boxes and rng.random() < 0.6:
            boxes[boxes.index(behind)] = player
        player = nxt
        score = sum(abs(b // width - t // width) + abs(b % width - t % width) for b, t in zip(boxes, targets, strict=True))
        if score >= best_score and score > 0 and not set(boxes) <= set(targets):
            best, best_score = (player, frozenset(boxes)), score
    return best


def generate_room(
    seed: int,
    *,
    dim: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    max_steps: int = 40,
    max_gen_attempts: int = 200,
    solver_max_nodes: int = 200_000,
    heldout_seed_start: int | None = HELDOUT_SEED_START,
) -> tuple[tuple[str, ...], int]:
    """A solvable room for ``seed``, as symbol rows, and the length of its optimal plan.

    A pure function of its arguments. See the module docstring for the method.

    Raises:
        RuntimeError: No acceptable room in ``max_gen_attempts`` tries (the message says which
            setting to change).
    """
    height, width = dim
    rng = random.Random(f"arborl.sokoban/{height}x{width}/{num_boxes}/{max_steps}/{seed}")
    part = wants_heldout(seed, heldout_seed_start)
    for _ in range(max_gen_attempts):
        topology = _topology(rng, height, width, num_boxes)
        if topology is None:
            continue
        walls, floor = topology
        targets = rng.sample(floor, num_boxes)
        player = rng.choice([cell for cell in floor if cell not in targets])
        start = _reverse_play(rng, walls, targets, player, width, n_moves=12 * len(floor))
        if start is None:
            continue
        rows = render_room(height, width, walls, frozenset(targets), start)
        if part is not None and in_heldout_part("/".join(rows)) != part:
            continue
        plan = solve(walls, frozenset(targets), height, width, start, max_nodes=solver_max_nodes)
        if plan and len(plan) <= max_steps:
            return rows, len(plan)
    raise RuntimeError(
        f"Sokoban: no solvable room within {max_gen_attempts} attempts for seed={seed}, dim={dim}, "
        f"num_boxes={num_boxes}, max_steps={max_steps}; use fewer boxes, a larger dim, a larger max_steps, "
        "a larger solver_max_nodes or max_gen_attempts."
    )


class Sokoban:
    """Text Sokoban on generated, solvable rooms (see the module docstring for rules and rewards).

    Args:
        dim: Room size ``(rows, cols)`` including the wall border, or one int for a square.
        num_boxes: Boxes (and targets) per generated room, 1 to 4.
        max_steps: Steps (valid or not) before truncation; ``None`` means
            ``10 * interior_cells // 4`` (40 for 6x6). Generated rooms need at most this many moves.
        obs_format: ``"rows"`` / ``"rows+cols"`` (tiny tokenizers) or ``"grid"`` (LLMs).
        box_reward: Shaping: +``box_reward`` when a push puts a box on a target, minus it when a
            push takes one off (0 disables).
        max_gen_attempts: Rooms tried per reset before giving up with an error.
        solver_max_nodes: State budget of the BFS solver (generation check and ``expert_action``).
        heldout_seed_start: Seeds from here on play held-out rooms only, seeds below it training
            rooms only; ``None`` turns the split off.

    ``reset(options={"room": ["#####", ...]})`` plays an explicit room written in the symbols.
    """

    task_type = "sokoban"
    actions = ACTIONS
    deterministic = True

    def __init__(
        self,
        *,
        dim: int | tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int | None = None,
        obs_format: str = "rows",
        box_reward: float = 0.0,
        max_gen_attempts: int = 200,
        solver_max_nodes: int = 200_000,
        heldout_seed_start: int | None = HELDOUT_SEED_START,
    ) -> None:
        height, width = (dim, dim) if isinstance(dim, int) else tuple(dim)
        if not (4 <= height <= 16 and 4 <= width <= 16):
            raise ValueError(f"Sokoban: dim={dim!r} must be between 4 and 16 per side (the border is wall).")
        if not 1 <= num_boxes <= 4 or 2 * num_boxes + 2 > (height - 2) * (width - 2):
            raise ValueError(
                f"Sokoban: num_boxes={num_boxes} does not fit dim={dim!r}; use 1-4 boxes and at least "
                "2 * num_boxes + 2 interior cells."
            )
        check_obs_format(obs_format, "Sokoban")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"Sokoban: max_steps={max_steps!r} must be a positive int or None.")
        self.dim, self.num_boxes, self.obs_format = (height, width), num_boxes, obs_format
        self.max_steps = max_steps if max_steps is not None else 10 * (height - 2) * (width - 2) // 4
        self.box_reward, self.max_gen_attempts, self.solver_max_nodes = box_reward, max_gen_attempts, solver_max_nodes
        self.heldout_seed_start = heldout_seed_start
        self._seed_rng = random.Random()  # draws the seed of a reset(seed=None)
        self._height = self._width = 0
        self._walls: frozenset[int] = frozenset()
        self._targets: frozenset[int] = frozenset()
        self._state: State = (0, frozenset())
        self._plan: dict[State, int] = {}
        self._steps, self._done, self._success = 0, False, False
        self._last_obs = GridObs(rows=())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[GridObs, dict]:
        """Start an episode on the room of ``seed`` (or ``options["room"]``).

        Returns:
            ``(obs, info)`` with ``info = {"seed": ..., "room": rows, "optimal_steps": n | None}``
            (``None`` for an explicit room: it is not solved up front).
        """
        seed, options = begin_reset(self._seed_rng, seed, options, option="room", env_name="Sokoban")
        optimal: int | None = None
        if "room" in options:
            rows = tuple(options["room"]) if isinstance(options["room"], list | tuple) else options["room"]
        else:
            rows, optimal = generate_room(
                seed, dim=self.dim, num_boxes=self.num_boxes, max_steps=self.max_steps,
                max_gen_attempts=self.max_gen_attempts, solver_max_nodes=self.solver_max_nodes,
                heldout_seed_start=self.heldout_seed_start,
            )
        self._height, self._width, self._walls, self._targets, self._state = parse_room(rows)
        static = render_room(self._height, self._width, self._walls, self._targets, (-1, frozenset()))
        self._fingerprint = "/".join(static)
        self._plan = {}
        self._steps, self._done, self._success = 0, False, False
        self._last_obs = self._obs("", "")
        return self._last_obs, {"seed": seed, "room": tuple(rows), "optimal_steps": optimal}

    def step(self, action: str) -> StepResult:
        """Apply the model's text; never raises on malformed text (see :mod:`arborl.env.base`)."""
        self._require_reset()
        name, answered = begin_step(self, action, ACTIONS)
        if answered is not None:
            return answered
        out_of_steps = self._steps >= self.max_steps
        before = self._state
        self._state = self._move(before, ACTIONS.index(name))
        on_before, on_after = len(before[1] & self._targets), len(self._state[1] & self._targets)
        reward = self.box_reward * (on_after - on_before)
        terminated = self._state[1] <= self._targets
        truncated = out_of_steps and not terminated
        info = {"action_valid": True, "action": name, "moved": self._state != before, "boxes_on_target": on_after}
        if terminated:
            reward += 1.0
            status, message = "solved", "Every box is on a target: solved."
        elif truncated:
            status, message = "timeout", f"Out of steps ({self.max_steps})."
        else:
            status, message = "", "" if self._state != before else "Blocked: nothing moved."
        if terminated or truncated:
            self._done, self._success = True, terminated
            info["success"] = terminated
        self._last_obs = self._obs(status, message)
        return StepResult(self._last_obs, float(reward), terminated, truncated, info)

    def format_observation(self, obs: GridObs) -> str:
        """Render ``obs`` in this env's ``obs_format``."""
        if self.obs_format in ("rows", "rows+cols"):
            return render_rows(obs, with_cols=self.obs_format == "rows+cols")
        intro = "Sokoban. Push every box onto a target. You can push one box at a time and cannot pull."
        legend = "# wall, _ floor, O target, X box, V box on target, P you, S you on a target"
        return render_grid(obs, intro=intro, legend=legend, actions=ACTIONS)

    def state_key(self) -> tuple[str, int, tuple[int, ...]]:
        """``(room fingerprint, player cell, sorted box cells)``; cells are ``row * width + col``."""
        self._require_reset()
        return self._fingerprint, self._state[0], tuple(sorted(self._state[1]))

    def expert_action(self) -> str:
        """The next move of a shortest solution from the current state.

        The plan is cached and recomputed only when the state left it. Returns ``ACTIONS[0]``
        when no plan exists (episode over, deadlock, or the solver's node budget ran out).
        """
        self._require_reset()
        if self._done:
            return ACTIONS[0]
        if self._state not in self._plan:
            plan = solve(self._walls, self._targets, self._height, self._width, self._state,
                         max_nodes=self.solver_max_nodes)
            self._plan = {}
            state = self._state
            for action in plan or []:
                self._plan[state] = action
                state = self._move(state, action)
            if not self._plan:
                return ACTIONS[0]
        return ACTIONS[self._plan[self._state]]

    def close(self) -> None:
        """Nothing to release; present for the contract."""

    def _move(self, state: State, action: int) -> State:
        delta = _deltas(self._width)[action]
        player, boxes = state
        nxt = player + delta
        if nxt in self._walls:
            return state
        if nxt in boxes:
            beyond = nxt + delta
            if beyond in self._walls or beyond in boxes:
                return state
            return nxt, (boxes - {nxt}) | {beyond}
        return nxt, boxes

    def _obs(self, status: str, message: str) -> GridObs:
        rows = render_room(self._height, self._width, self._walls, self._targets, self._state)
        return GridObs(rows=rows, status=status, message=message)

    def _require_reset(self) -> None:
        if not self._height:
            raise RuntimeError("Sokoban: call reset() before step(), state_key() or expert_action().")
