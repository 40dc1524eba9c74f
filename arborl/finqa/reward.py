"""FinQA execution accuracy: a numeric answer is right within a relative tolerance of 1e-2.

How an answer string is read (:func:`parse_answer`):

* surrounding spaces, a leading ``$`` (also ``-$5``), thousands separators (``1,250``) and
  spaces inside the number are dropped; ``(150)`` is accounting notation for ``-150``;
* a trailing ``%``, ``percent`` or ``pp`` / ``percentage points`` marks a percentage; a
  trailing ``million(s)`` / ``m`` is dropped (answers are in the table's unit, millions);
* anything else (words, two numbers, an empty string) is a **parse failure**: it scores 0 and
  :func:`score` reports it, so the env counts it.

How it is compared (:func:`matches`): the prediction ``v`` is right when
``|v - g| <= 1e-2 * |g|`` for the gold ``g``. For a percentage gold (``unit == "%"``, e.g.
12.5 for 12.5%), the fraction ``0.125`` is right too (FinQA's programs compute fractions); a
prediction written with ``%`` is also compared as its fraction (``45%`` for a ratio of 0.45).
A gold of 0 needs the prediction to be 0 within 1e-9.
"""

from __future__ import annotations

import math
import re

REL_TOL = 1e-2
"""FinQA's tolerance: relative to the gold answer."""

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_PERCENT = re.compile(r"\s*(%|percent|pp|percentage points?)\s*$", re.IGNORECASE)
_SCALE = re.compile(r"\s*(millions?|m)\s*$", re.IGNORECASE)


def parse_answer(text: str) -> tuple[float, bool] | None:
    """``(value, is_percent)`` of an answer string, or ``None`` when it is not one number.

    >>> parse_answer("$1,250"), parse_answer("12.5 %"), parse_answer("(150)"), parse_answer("about 3")
    ((1250.0, False), (12.5, True), (-150.0, False), None)
    """
    s = text.strip()
    percent = bool(_PERCENT.search(s))
    s = _PERCENT.sub("", s) if percent else _SCALE.sub("", s)
    s = s.replace(",", "").replace(" ", "")
    negative = s.startswith("(") and s.endswith(")")
    if negative:
        s = s[1:-1]
    s = re.sub(r"^([+-]?)\$", r"\1", s)
    if not _NUMBER.fullmatch(s):
        return None
    value = float(s)
    if not math.isfinite(value):
        return None
    return (-value if negative else value), percent


def matches(value: float, is_percent: bool, gold: float, unit: str = "") -> bool:
    """Whether a parsed prediction equals the gold within :data:`REL_TOL` (rules in the module docstring)."""
    candidates = [value, value / 100] if is_percent else [value]
    targets = [gold, gold / 100] if unit == "%" else [gold]
    return any(abs(c - g) <= max(REL_TOL * abs(g), 1e-9) for c in candidates for g in targets)


def score(answer: str, gold: float, unit: str = "") -> tuple[float, bool]:
    """``(reward, parsed)``: 1.0 or 0.0, and False when the answer did not parse (a parse failure)."""
    parsed = parse_answer(answer)
    if parsed is None:
        return 0.0, False
    return float(matches(parsed[0], parsed[1], gold, unit)), True
