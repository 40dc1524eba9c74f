"""Token arrays as packed binary, for the SQLite turn rows.

A turn's ``prompt_ids``, ``output_ids``, ``output_logprobs`` and ``output_mask`` are most of its
size, and parsing them from JSON dominates read time (about 28 us for a 120-number turn against
11 us packed). Packing is exact or not done: ids and the mask are packed only when every value is
a plain ``int`` that fits (int32 for ids, 0/1 for the mask), log-probs only when every value is a
plain ``float`` (float64, bit-exact). Anything else (bools, ints among the log-probs, ids of 2**31
or more) stays in the JSON body, so a read-back turn is equal *and* hashes equal to the one
written. Byte order is little-endian on disk.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

ARRAY_FIELDS = ("prompt_ids", "output_ids", "output_logprobs", "output_mask")
_CODE = {"prompt_ids": "i", "output_ids": "i", "output_logprobs": "d", "output_mask": "b"}
_SWAP = sys.byteorder == "big"


def _pack(values: Any, code: str) -> bytes | None:
    if not isinstance(values, list):
        return None
    # exact types only (a bool is an int subclass, an int is not a float); set(map(type)) runs in C
    return pack_exact(values, code, set(map(type, values)) <= ({float} if code == "d" else {int}))


def pack_exact(values: Any, code: str, plain: bool) -> bytes | None:
    """Pack a list whose exact-type check (``plain``) is already done; ``code``: "i", "d" or "b".

    Returns ``None`` (keep the values in JSON) unless ``plain`` and every value fits the code.
    """
    if not plain:
        return None
    try:
        a = array(code, values)
    except OverflowError:
        return None
    if code == "b" and a and (min(a) < 0 or max(a) > 1):
        return None
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _unpack(data: bytes, code: str) -> list[Any]:
    a = array(code)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def pack_arrays(d: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | None]]:
    """Split a turn dict into (the rest, packed arrays); ``None`` where a field stays in the rest."""
    blobs = [_pack(d.get(name), _CODE[name]) for name in ARRAY_FIELDS]
    rest = {k: v for k, v in d.items() if not (k in _CODE and blobs[ARRAY_FIELDS.index(k)] is not None)}
    return rest, blobs


def unpack_into(td: dict[str, Any], blobs: tuple[bytes | None, ...] | list[bytes | None]) -> dict[str, Any]:
    """Put packed arrays back into a turn dict (in place; returns it)."""
    for name, data in zip(ARRAY_FIELDS, blobs, strict=True):
        if data is not None:
            td[name] = _unpack(data, _CODE[name])
    return td
