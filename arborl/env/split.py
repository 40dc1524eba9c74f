"""Stable hashes of task keys: held-out splits and per-task choices that do not depend on a seed.

A key (a company name, a subject passage id, a question id) maps to a number in ``[0, 1)`` by the
first 8 bytes of its SHA-256, so the same key lands on the same side of a split in every run, on
every machine, whatever the order or number of tasks drawn.
"""

from __future__ import annotations

import hashlib


def stable_unit(key: str) -> float:
    """``key`` as a number in ``[0, 1)``, the same in every run (SHA-256, first 8 bytes)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def held_out(key: str, test_frac: float) -> bool:
    """Whether ``key`` falls in the held-out share ``test_frac`` of a split."""
    return stable_unit(key) < test_frac
