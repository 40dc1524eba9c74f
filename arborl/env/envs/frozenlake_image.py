"""FrozenLake seen as pictures: the map is a small RGB image, the text says only the turn number.

Dynamics, maps, rewards, expert and state keys are :class:`~arborl.env.envs.frozenlake.FrozenLake`'s;
only the observation differs. Each cell is a ``cell_px`` x ``cell_px`` block of one colour
(ice, hole, goal, player), so a ``size`` 4 lake is a 16 x 16 image and a patch encoder with
4-pixel patches reads one cell per patch. The observation is one user message in the Hugging
Face multimodal form, ``[{"type": "image", "image": array}, {"type": "text", "text": "turn 3"}]``
(plus the status word after an invalid move or at the end); the rollout stores the image by
reference (:mod:`arborl.rollout.media`).

``map_turns="first"``: the lake (holes and goal) is drawn in turn 1 only; later images show the
player on blank cells. Reaching the goal then needs the turn-1 image at later turns, which the
rollout keeps in the model's input (``docs/multimodal.md``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from arborl.env.envs._grid import GridObs
from arborl.env.envs.frozenlake import FrozenLake

COLOURS = {"_": (210, 230, 255), "H": (20, 30, 90), "G": (40, 200, 60), "P": (230, 40, 40), "S": (210, 230, 255)}
"""RGB of each map symbol (ice, hole, goal, player; the start cell is ice)."""
BLANK = (128, 128, 128)
"""Colour of a cell whose content is not shown (``map_turns="first"`` after turn 1)."""


def render_lake(rows: tuple[str, ...], cell_px: int, *, show_map: bool = True) -> np.ndarray:
    """The ``(R * cell_px, C * cell_px, 3)`` uint8 picture of grid ``rows`` (player drawn in).

    With ``show_map=False`` every cell but the player's is :data:`BLANK`.
    """
    img = np.zeros((len(rows) * cell_px, len(rows[0]) * cell_px, 3), dtype=np.uint8)
    for r, row in enumerate(rows):
        for c, sym in enumerate(row):
            colour = COLOURS.get(sym, BLANK) if show_map or sym == "P" else BLANK
            img[r * cell_px:(r + 1) * cell_px, c * cell_px:(c + 1) * cell_px] = colour
    return img


class FrozenLakeImage(FrozenLake):
    """FrozenLake whose observations are an image of the lake and the turn number.

    Args:
        map_turns: ``"every"`` draws the lake every turn; ``"first"`` only in turn 1 (later
            images show the player alone).
        cell_px: Pixels per cell side.
        **kwargs: :class:`~arborl.env.envs.frozenlake.FrozenLake`'s arguments (``obs_format`` is
            ignored).
    """

    def __init__(self, *, map_turns: Literal["every", "first"] = "every", cell_px: int = 4, **kwargs: Any) -> None:
        if map_turns not in ("every", "first"):
            raise ValueError(f"FrozenLakeImage: map_turns={map_turns!r}; use 'every' or 'first'")
        if not isinstance(cell_px, int) or cell_px < 1:
            raise ValueError(f"FrozenLakeImage: cell_px={cell_px!r} must be a positive int")
        super().__init__(**kwargs)
        self.map_turns, self.cell_px = map_turns, cell_px

    def format_observation(self, obs: GridObs) -> list[dict[str, Any]]:
        """One user message: the lake's image and ``turn N`` (after the status word, if any)."""
        turn = self._steps + 1
        image = render_lake(obs.rows, self.cell_px, show_map=self.map_turns == "every" or turn == 1)
        text = f"{obs.status} turn {turn}" if obs.status else f"turn {turn}"
        return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]
