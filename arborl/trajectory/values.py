"""What a value in a trajectory record may be: data that every store backend reads back exactly.

A record is stored as JSON text (SQLite, Redis) or as PostgreSQL ``jsonb`` and typed columns.
Those differ at the edges, so the schema accepts only the values on which they all agree, and
refuses the rest with a :class:`SchemaError` before anything is written:

* **text**: no NUL character (PostgreSQL ``text`` and ``jsonb`` cannot hold one) and no lone
  surrogate (it has no UTF-8 encoding);
* **integers**: 64-bit signed (:data:`INT_MIN`..:data:`INT_MAX`; PostgreSQL ``bigint``, SQLite
  ``INTEGER``); fields kept in 32-bit index columns check :data:`INT32_MIN`..:data:`INT32_MAX`;
* **floats**: finite, of magnitude below :data:`FLOAT_LIMIT`, and not ``-0.0``: ``jsonb`` keeps
  numbers as decimals, so it reads ``1e+16`` back as the integer ``10000000000000000`` and has no
  negative zero, and either would change the content hash;
* **containers**: ``dict`` with ``str`` keys (JSON turns ``{1: 2}`` into ``{"1": 2}``) and
  ``list`` (a tuple would read back as a list), nested at most :data:`MAX_DEPTH` deep (deeper
  data overflows the recursion of JSON encoders and decoders);
* ``bool`` and ``None``.

This module knows nothing of the record types (:mod:`arborl.trajectory.schema` builds on it).
"""

from __future__ import annotations

import math
import re
from array import array
from operator import countOf
from typing import Any

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Range of integers in a record (64-bit signed)."""
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""Range of integers kept in 32-bit index columns (``policy_version``, ``iteration``)."""
FLOAT_LIMIT = 1e16
"""Floats must be smaller in magnitude: from here on Python writes them with an exponent, which
PostgreSQL's ``jsonb`` reads back as an integer."""
MAX_DEPTH = 64
"""Deepest nesting of lists and dicts in a free-form field (``info``, ``metadata``, ...)."""

_TYPES = "a dict with str keys, list, str, int, float, bool or None"


class SchemaError(ValueError):
    """A trajectory record is malformed; the message names the field and the fix."""


def text_problem(s: str) -> str | None:
    """Why ``s`` cannot be stored (a NUL character, a lone surrogate), or ``None``."""
    if s.isascii():
        return "contains a NUL character (\\x00)" if "\x00" in s else None
    if "\x00" in s:
        return "contains a NUL character (\\x00)"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"contains a lone surrogate {s[e.start]!r} at position {e.start} (not encodable as UTF-8)"
    return None


_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")


def storable_text(s: str) -> str:
    """``s`` with each NUL character and lone surrogate replaced by U+FFFD (the rest unchanged).

    For text that arborl records but did not write itself (env observations, tool output, a
    decoded model answer): a snippet that prints ``\\x00`` must not make the store refuse the
    batch. The token ids stay the record of what the model saw and wrote.
    """
    if text_problem(s) is None:
        return s
    return _UNSTORABLE_CHAR.sub("\ufffd", s)


def check_texts(texts: list[str], where: str) -> None:
    """Check many strings at once (one C scan of their concatenation in the usual ASCII case)."""
    joined = "".join(texts)
    if joined.isascii() and "\x00" not in joined:
        return
    for s in texts:
        why = text_problem(s)
        if why is not None:
            raise SchemaError(f"{where}: the text {_clip(s)} {why}; remove or replace it before storing")


def float_problem(v: float) -> str | None:
    """Why float ``v`` cannot be stored exactly, or ``None``."""
    if not -FLOAT_LIMIT < v < FLOAT_LIMIT:  # also false for NaN
        return ("is not finite" if not math.isfinite(v) else
                f"has magnitude >= {FLOAT_LIMIT:g} (PostgreSQL would read it back as an integer)")
    if v == 0.0 and math.copysign(1.0, v) < 0:
        return "is -0.0 (PostgreSQL has no negative zero); write 0.0"
    return None


def number_problem(v: Any, lo: int = INT_MIN, hi: int = INT_MAX) -> str | None:
    """Why ``v`` is not a storable int (in ``lo..hi``) or float, or ``None``."""
    t = type(v)
    if t is int:
        return None if lo <= v <= hi else f"is outside {lo}..{hi}"
    if t is float:
        return float_problem(v)
    return f"is a {t.__name__}, not a number"


def check_number(v: Any, where: str, lo: int = INT_MIN, hi: int = INT_MAX) -> None:
    """Raise :class:`SchemaError` unless ``v`` is a storable int or float."""
    why = number_problem(v, lo, hi)
    if why is not None:
        raise SchemaError(f"{where} = {_clip(v)} {why}")


def check_int(v: Any, where: str, lo: int = INT_MIN, hi: int = INT_MAX) -> None:
    """Raise :class:`SchemaError` unless ``v`` is an ``int`` (not a bool) in ``lo..hi``."""
    if type(v) is not int:
        raise SchemaError(f"{where} must be an integer, got {_clip(v)}")
    if not lo <= v <= hi:
        raise SchemaError(f"{where} = {v} is outside {lo}..{hi}")


def check_json(value: Any, where: str) -> None:
    """Raise :class:`SchemaError` naming the first part of ``value`` that is not storable data.

    The usual case (small, plain data) is one fast recursive pass; only a failing value is
    walked again to name the path, e.g. ``info['a'][2]``.
    """
    if not _ok(value, 0):
        raise SchemaError(_problem(value, where, 0) or f"{where} cannot be stored")


# --- token arrays (the rules of Turn's four arrays, on the usual path in C passes) --------------
def raise_type(obj: Any, names: tuple[str, ...], want: type, where: str, optional: bool = False) -> None:
    """Raise naming the first of ``names`` whose value is not of type ``want`` (or None, if ``optional``)."""
    for name in names:
        v = getattr(obj, name)
        if type(v) is not want and not (optional and v is None):
            raise SchemaError(f"{where}: {name} must be a {want.__name__}{' or None' if optional else ''}, got {v!r}")


def check_token_arrays(t: Any, where: str) -> None:
    """A turn's four token arrays: lists, one log-prob and one mask value per output id, storable
    ints and floats, a 0/1 mask; raise :class:`SchemaError` naming the first that is not.
    """
    oi, ol, om, pi = t.output_ids, t.output_logprobs, t.output_mask, t.prompt_ids
    if not (type(oi) is list and type(ol) is list and type(om) is list and type(pi) is list):
        for name in ("output_ids", "output_logprobs", "output_mask", "prompt_ids"):
            v = getattr(t, name)
            if type(v) is not list:
                raise SchemaError(f"{where}: {name} must be a list (a {type(v).__name__} would read back as a list)")
    n = len(oi)
    if len(ol) != n:
        raise SchemaError(
            f"{where}: output_logprobs has {len(ol)} entries but output_ids has {n}; "
            "record one behaviour log-prob per generated token")
    if len(om) != n:
        raise SchemaError(
            f"{where}: output_mask has {len(om)} entries but output_ids has {n}; "
            "record one mask value (0/1) per generated token")
    for name, ids in (("output_ids", oi), ("prompt_ids", pi)):
        try:
            array("q", ids)  # one C pass: every id an int (or bool) within 64 bits
        except (TypeError, OverflowError):
            _check_ids(ids, f"{where}: {name}")
    if countOf(map(type, ol), float) != n or (t := sum(ol)) - t != 0.0 or 0.0 in ol:  # else each value is looked at
        _slow_logprobs(ol, where)
    _check_logprob_values(ol, where)
    if countOf(om, 0) + countOf(om, 1) != n:  # m in (0, 1)
        raise SchemaError(f"{where}: output_mask values must be 0 or 1")


def _check_logprob_values(ol: list[float], where: str) -> None:
    """Finite floats, no -0.0: refuse a magnitude of FLOAT_LIMIT or more (in C passes in the usual case)."""
    # log-probs are <= 0: then every value lies between the (finite) sum and 0
    if ol and not (max(ol) <= 0.0 and sum(ol) > -FLOAT_LIMIT) and (min(ol) <= -FLOAT_LIMIT or max(ol) >= FLOAT_LIMIT):
        _slow_logprobs(ol, where)


def _slow_logprobs(ol: list[Any], where: str) -> None:
    for k, x in enumerate(ol):
        why = number_problem(x)
        if why is not None:
            raise SchemaError(f"{where}: output_logprobs[{k}] = {x!r} {why}")


def _check_ids(ids: list[Any], where: str) -> None:
    for k, x in enumerate(ids):
        if type(x) is not int and type(x) is not bool:
            raise SchemaError(f"{where}[{k}] = {x!r} is not an integer token id")
        if not INT_MIN <= x <= INT_MAX:
            raise SchemaError(f"{where}[{k}] = {x} is outside the 64-bit range {INT_MIN}..{INT_MAX}")


def _ok(v: Any, depth: int) -> bool:
    t = type(v)
    if t is str:
        return (v.isascii() and "\x00" not in v) or text_problem(v) is None
    if t is int:
        return INT_MIN <= v <= INT_MAX
    if t is float:
        return -FLOAT_LIMIT < v < FLOAT_LIMIT and (v != 0.0 or math.copysign(1.0, v) > 0)
    if v is None or t is bool:
        return True
    if depth >= MAX_DEPTH:
        return False
    if t is dict:
        keys = "".join(v) if countOf(map(type, v), str) == len(v) else None  # one scan for all the keys
        if keys is None or not ((keys.isascii() and "\x00" not in keys) or text_problem(keys) is None):
            return False
        v = v.values()
    elif t is not list:
        return False
    for x in v:  # noqa: SIM110 - a loop, not all(generator): one frame less per item on the hot path
        tx = type(x)
        if tx is str:
            if not ((x.isascii() and "\x00" not in x) or text_problem(x) is None):
                return False
        elif tx is not bool and x is not None and not _ok(x, depth + 1):
            return False
    return True


def _problem(v: Any, where: str, depth: int) -> str | None:
    """The message for the first unstorable part of ``v`` (the slow twin of :func:`_ok`)."""
    t = type(v)
    if t is str:
        why = text_problem(v)
        return None if why is None else f"{where}: the text {_clip(v)} {why}; remove or replace it before storing"
    if t is int or t is float:
        why = number_problem(v)
        return None if why is None else f"{where} = {_clip(v)} {why}"
    if v is None or t is bool:
        return None
    if t is tuple:
        return f"{where} is a tuple, which reads back as a list; store a list"
    if t not in (list, dict):
        return f"{where} is a {t.__name__}; a stored value must be {_TYPES}"
    if depth >= MAX_DEPTH:
        return f"{where} is nested more than {MAX_DEPTH} levels deep; flatten it"
    items = enumerate(v) if t is list else v.items()
    for k, x in items:
        if t is dict and type(k) is not str:
            return f"{where} has the key {k!r} ({type(k).__name__}), which JSON turns into the string {str(k)!r}; use str keys"
        sub = f"{where}[{k!r}]"
        why = (_problem(k, f"{where} key", depth) if t is dict else None) or _problem(x, sub, depth + 1)
        if why is not None:
            return why
    return None


def _clip(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else f"{r[:n]}..."


def is_storable(value: Any) -> bool:
    """Whether ``value`` passes :func:`check_json` (for code that drops what it cannot store)."""
    return _ok(value, 0)
