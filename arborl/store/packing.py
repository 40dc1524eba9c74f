"""Token arrays as packed binary, for the SQLite turn rows.

A turn's ``prompt_ids``, ``output_ids``, ``output_logprobs`` and ``output_mask`` are most of its
size, and parsing them from JSON dominates read time (about 28 us for a 120-number turn against
11 us packed). The packed form is the one :meth:`~arborl.trajectory.schema.Episode.content_hash`
hashes (:func:`~arborl.trajectory.canonical.pack_array`): exact or not done. Ids and the mask pack
when the array's JSON value is a list of integers that fit (int32 for ids, 0/1 for the mask),
log-probs when it is a list of floats (float64, bit-exact). Anything else (bools, ints among the
log-probs, ids of 2**31 or more) stays in the JSON body, so a read-back turn is equal *and*
hashes equal to the one written. Byte order is little-endian on disk.
"""

from __future__ import annotations

from typing import Any

from arborl.trajectory.canonical import pack_array, unpack_array

ARRAY_FIELDS = ("prompt_ids", "output_ids", "output_logprobs", "output_mask")
_CODE = {"prompt_ids": "i", "output_ids": "i", "output_logprobs": "d", "output_mask": "b"}


def _pack(values: Any, code: str) -> bytes | None:
    packed = pack_array(values, code)
    return packed if type(packed) is bytes else None


def pack_arrays(d: dict[str, Any]) -> tuple[dict[str, Any], list[bytes | None]]:
    """Split a turn dict into (the rest, packed arrays); ``None`` where a field stays in the rest."""
    blobs = [_pack(d.get(name, []), _CODE[name]) for name in ARRAY_FIELDS]
    rest = {k: v for k, v in d.items() if not (k in _CODE and blobs[ARRAY_FIELDS.index(k)] is not None)}
    return rest, blobs


def unpack_into(td: dict[str, Any], blobs: tuple[bytes | None, ...] | list[bytes | None]) -> dict[str, Any]:
    """Put packed arrays back into a turn dict (in place; returns it)."""
    for name, data in zip(ARRAY_FIELDS, blobs, strict=True):
        if data is not None:
            td[name] = unpack_array(data, _CODE[name])
    return td
