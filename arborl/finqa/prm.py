"""A FinQA step reward for the explicit PRM: did the calculator call copy the values the lookups returned?

FinQA episodes that look up the right cells often fail at the next step: the calculator call
miscopies a looked-up value digit by digit (docs/finqa.md, docs/credit.md §13.15). The episode's
outcome blames every turn alike; :func:`operands_copied` labels that one turn by what it did.
List it beside ``progress`` in ``rl.prm_dimensions``::

    rl.prm_dimensions = ["progress", "arborl.finqa.prm:operands_copied"]
"""

from __future__ import annotations

import re

from arborl.finqa.digits import joined_digits
from arborl.trajectory.schema import Turn

CONSTANTS = frozenset({"1", "2", "100"})
"""Numbers the expression templates bring themselves (``* 100``, ``round( ... , 1 )``), not cells."""

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def operands_copied(turns: list[Turn], k: int, label: float) -> float | None:
    """1.0 if every number of turn ``k``'s calculator expression is one an earlier lookup returned.

    Numbers are read with their spaced digits joined (``2 1 0`` is 210); the templates' constants
    (:data:`CONSTANTS`) pass. 0.0 for an expression that holds a number no lookup returned, or no
    number at all; ``None`` (no label) for a turn that is not a calculator call. The Monte-Carlo
    ``label`` is not used: whether the copy is right does not depend on how the episode ended.
    """
    call = turns[k].tool_call
    if call is None or call.name != "calculator":
        return None
    seen: set[str] = set()
    for t in turns[:k]:
        if t.tool_call is not None and t.tool_call.name == "lookup" and t.result:
            seen.update(_NUMBER.findall(joined_digits(t.result)))
    numbers = _NUMBER.findall(joined_digits(str(call.arguments.get("expression", ""))))
    return float(bool(numbers) and all(n in seen or n in CONSTANTS for n in numbers))
