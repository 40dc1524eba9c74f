"""The canonical form of an episode and :func:`content_hash`, the one definition of the hash.

Kept apart from :mod:`arborl.trajectory.schema` (the record types, which this module imports and
which import nothing from here) because it is the one piece tuned for speed: the trajectory store
builds its rows from the same pieces (:func:`canonical_turns`), so content hashing and storage
share one definition, and the store hashes with :func:`content_hash` on the pieces it built.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import sys
from array import array
from collections.abc import Callable
from functools import cache, partial
from json.encoder import c_make_encoder, encode_basestring_ascii
from operator import countOf
from typing import Any, NamedTuple

from arborl.trajectory.schema import EPISODE_FIELDS, TURN_FIELDS, Episode, ToolCall, plain

# --- canonical form (content hash) -----------------------------------------------------------
# canonical_episode() is a byte string of frames, each a tag byte, a little-endian uint64 length
# and that many bytes, so it parses back unambiguously (equal bytes <=> equal content):
#   b"arborl-content-v3\n"
#   frame "e": the episode's hashed fields (to_dict() without HASH_EXCLUDED and turns) as JSON;
#   per turn, in creation order:
#     frame "t": the turn without timings and its four token arrays as JSON, with turn_id and
#                parent_id replaced by creation-order numbers;
#     per array, in CANONICAL_ARRAYS order, one frame: tag "i" (int32), "d" (float64) or "b"
#                (int8) with the array packed little-endian when its JSON value is a list of
#                values that fit that field's code exactly (ARRAY_CODES), otherwise tag "j" and
#                the array's JSON text.
# JSON here is json.dumps(v, sort_keys=True, separators=(",", ":"), allow_nan=False). Hashing
# the arrays as bytes avoids formatting every token id and log-prob as text (most of the cost of
# a JSON-only definition), and the SQLite store keeps the same bytes as its turn records.
_CANON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, sort_keys=True)


def compact_json_encoder(sort_keys: bool) -> Callable[[Any], str]:
    """``json.JSONEncoder(separators=(",", ":"), allow_nan=False, sort_keys=sort_keys).encode``, faster.

    The same C encoder and the same text (circular references detected, ``NaN`` refused), minus
    the Python-level setup that ``JSONEncoder.encode`` repeats on every call (~1 us of a ~3 us
    encode of an episode's small fields).
    """
    make = c_make_encoder
    if make is None:  # a Python built without the _json accelerator
        return json.JSONEncoder(separators=(",", ":"), allow_nan=False, sort_keys=sort_keys).encode

    def default(o: Any) -> Any:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    def encode(obj: Any) -> str:
        return "".join(make({}, default, encode_basestring_ascii, None, ":", ",", sort_keys, False, False)(obj, 0))

    return encode


_canon_encode = compact_json_encoder(sort_keys=True)
HASH_EXCLUDED = frozenset({"episode_id", "created_at", "group_id", "iteration", "tags", "metadata"})
"""Episode fields that :func:`content_hash` leaves out (ids, timestamps, grouping, labels)."""
CANONICAL_ARRAYS = ("output_ids", "output_logprobs", "output_mask", "prompt_ids")
"""Token array fields of a turn in canonical (sorted-key) order: :attr:`CanonicalTurn.arrays`."""
ARRAY_CODES = ("i", "d", "b", "i")
"""Packed code of each of :data:`CANONICAL_ARRAYS`: int32 ids, float64 log-probs, 0/1 mask bytes."""
CONTENT_HASH_VERSION = b"arborl-content-v3\n"
"""First bytes of :func:`canonical_episode`; a new definition gets a new version (v3: ``origin`` is hashed)."""
_HEAD = ("action", "action_text", "error", "index", "info", "media", "observation")
_TAIL = ("result", "reward", "state_key", "terminated", "tool_call", "truncated")
_FRAME = struct.Struct("<cQ").pack
_HEADER = struct.Struct("<cQ").unpack_from
_CODE_TAGS = tuple(c.encode() for c in ARRAY_CODES)
_SWAP = sys.byteorder == "big"
if array("i").itemsize != 4 or array("d").itemsize != 8:
    raise ImportError("arborl's packed token arrays need a 4-byte C int and an 8-byte C double")


class CanonicalTurn(NamedTuple):
    """One turn's canonical form in pieces: JSON ``{head,<arrays>,mid,<prompt_ids>,tail}``.

    Attributes:
        head: ``"action":...`` through ``"observation":...`` (keys before ``output_ids``).
        mid: ``"parent_id":...,"policy_version":...`` (keys between ``output_mask`` and ``prompt_ids``).
        tail: ``"result":...`` through ``"valid":...`` (keys after ``prompt_ids``).
        rest: ``{head,mid,tail}``: the turn's JSON without its four token arrays.
        record: The turn's frames of :func:`canonical_episode`.
        checked: The usual turn, proven storable in passing (:meth:`Episode.validate` then checks
            only what this leaves open): every scalar field of its declared type (str, int, bool,
            a finite float, ``None`` where optional, a dict, a list, a ToolCall); no ``\\u``
            escape in the JSON text (so no NUL and no surrogate; non-ASCII text goes the full
            way); all four token arrays packed in one go, so
            lists of exact-type values (int32 ids, finite float log-probs of magnitude below
            2**49 and none -0.0, a 0/1 mask) of one length for the three output arrays.
    """

    head: str
    mid: str
    tail: str
    rest: str
    record: bytes
    checked: bool

    @property
    def arrays(self) -> tuple[bytes | str, ...]:
        """Per :data:`CANONICAL_ARRAYS`: packed bytes (see :func:`pack_array`) or JSON text, from :attr:`record`."""
        pos, out = 9 + _HEADER(self.record, 0)[1], []
        for _ in CANONICAL_ARRAYS:
            tag, n = _HEADER(self.record, pos)
            data, pos = self.record[pos + 9:pos + 9 + n], pos + 9 + n
            out.append(data.decode() if tag == b"j" else data)
        return tuple(out)

    def text(self, packed: bool = False) -> str:
        """The turn's canonical JSON; with ``packed``, the arrays held as bytes are left out."""
        if packed and countOf(map(type, self.arrays), bytes) == 4:
            return self.rest  # all packed: the store's usual row
        oi, ol, om, pi = (
            "" if packed and type(a) is bytes else f',"{n}":{array_json(a, c)}'
            for n, a, c in zip(CANONICAL_ARRAYS, self.arrays, ARRAY_CODES, strict=True))
        return f"{{{self.head}{oi}{ol}{om},{self.mid}{pi},{self.tail}}}"


def _record(rest: str, arrays: tuple[bytes | str, ...]) -> bytes:
    """One turn's frames: "t" and its rest JSON, then each array with its code or "j" and JSON."""
    r = rest.encode()
    if countOf(map(type, arrays), bytes) == 4:  # the usual case, without the loop
        oi, ol, om, pi = arrays
        return b"".join((_FRAME(b"t", len(r)), r, _FRAME(b"i", len(oi)), oi, _FRAME(b"d", len(ol)), ol,
                         _FRAME(b"b", len(om)), om, _FRAME(b"i", len(pi)), pi))
    parts = [_FRAME(b"t", len(r)), r]
    for a, code in zip(arrays, _CODE_TAGS, strict=True):
        if type(a) is str:
            a, code = a.encode(), b"j"
        parts += (_FRAME(code, len(a)), a)
    return b"".join(parts)


def _packed_record(rest: str, oi: Any, ol: Any, om: Any, pi: Any) -> bytes | None:
    """:func:`_record` when all four arrays pack (the usual turn), or ``None``.

    The checks are :func:`pack_array`'s (exact element types, int32 ids, 0/1 mask, finite
    log-probs); the three output arrays, which a valid turn has of one length, go through one
    cached Struct with their frame headers, and ``prompt_ids`` through a second.
    """
    if not (type(oi) is list and type(ol) is list and type(om) is list and type(pi) is list):
        return None
    n, m = len(oi), len(pi)
    if (len(ol) != n or len(om) != n or n > _STRUCT_MAX or m > _STRUCT_MAX
            or countOf(map(type, oi), int) != n or countOf(map(type, ol), float) != n
            or countOf(map(type, om), int) != n or countOf(map(type, pi), int) != m):
        return None
    if (s := sum(ol)) - s != 0.0 and not all(map(math.isfinite, ol)):  # a finite sum: all finite, one C pass
        return None
    out, prompt = _output_struct(n).pack, _prompt_struct(m).pack
    try:
        outputs = out(b"i", 4 * n, *oi, b"d", 8 * n, *ol, b"b", n, *om)
        prompts = prompt(b"i", 4 * m, *pi)
    except (OverflowError, struct.error):  # an id outside int32, a mask value outside a signed byte
        return None
    mask = len(outputs) - n  # the mask is the last n bytes: 0/1 counted on them, in C
    if outputs.count(1, mask) + outputs.count(0, mask) != n:
        return None
    r = rest.encode()
    return b"".join((_FRAME(b"t", len(r)), r, outputs, prompts))


# The high byte of a little-endian float64 is its sign and the top 7 bits of its exponent. Below
# 0x43 (0xC3 with the sign) the magnitude is under 2**49, well inside values.FLOAT_LIMIT (1e16);
# 0x80 is the high byte of -0.0 (and of negative numbers below 2**-1007), which is left out too.
_CLEAR_HIGH_BYTES = bytes([*range(0x43), *range(0x81, 0xC3)])


def _json(v: Any) -> str:
    """``_CANON.encode(plain(v))`` with the common types formatted directly."""
    t = type(v)
    if t is str:
        return encode_basestring_ascii(v)
    if v is None:
        return "null"
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return int.__repr__(v)
    if t is float and math.isfinite(v):
        return float.__repr__(v)
    if t is dict and len(v) < 8 and countOf(map(type, v), str) == len(v):  # small: sorted here, no encoder
        if len(v) == 1:
            ((k, x),) = v.items()
            return f"{{{encode_basestring_ascii(k)}:{_json(x)}}}"
        return "{" + ",".join([f"{encode_basestring_ascii(k)}:{_json(v[k])}" for k in sorted(v)]) + "}"
    if t is list and not v:
        return "[]"
    if t is ToolCall:
        return _tool_call_json(v)
    try:  # plain JSON data encodes as is; _plain converts what asdict would (dataclasses inside)
        return _canon_encode(v)
    except TypeError:
        return _canon_encode(plain(v))


def _tool_call_json(v: ToolCall) -> str:
    """On most turns: its fields in sorted order, without building a dict."""
    c, n = v.call_id, v.name
    call_id = "null" if c is None else _json(c)
    name = encode_basestring_ascii(n) if type(n) is str else _json(n)
    return f'{{"arguments":{_json(v.arguments)},"call_id":{call_id},"name":{name}}}'


# Fast paths of pack_array: None unless the value is a list of exact-type values that fit.
# struct packs little-endian directly and is ~2.5x faster than array(...).tobytes() for short
# arrays; its Structs are cached per length up to _STRUCT_MAX (longer arrays go through array).
_STRUCT_MAX = 4096


@cache
def _array_struct(code: str, n: int) -> struct.Struct:
    return struct.Struct(f"<{n}{code}")


@cache
def _output_struct(n: int) -> struct.Struct:
    """The three output frames (ids i, log-probs d, mask b) with their headers, for ``n`` tokens."""
    return struct.Struct(f"<cQ{n}icQ{n}dcQ{n}b")


@cache
def _prompt_struct(m: int) -> struct.Struct:
    """The prompt-ids frame (i) with its header, for ``m`` tokens."""
    return struct.Struct(f"<cQ{m}i")


def _packer(code: str, n: int) -> Callable[..., bytes] | None:
    return None if n > _STRUCT_MAX else _array_struct(code, n).pack


def _pack_long(v: list[Any], code: str) -> bytes:
    a = array(code, v)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _pack_ids(v: Any) -> bytes | None:
    if type(v) is not list or countOf(map(type, v), int) != len(v):  # exact types: no bools
        return None
    p = _packer("i", len(v))
    try:
        return _pack_long(v, "i") if p is None else p(*v)
    except (OverflowError, struct.error):  # outside int32
        return None


def _pack_logprobs(v: Any) -> bytes | None:
    # a finite sum means every value is finite (one C pass); else check each value
    if type(v) is not list or countOf(map(type, v), float) != len(v):
        return None
    if (s := sum(v)) - s != 0.0 and not all(map(math.isfinite, v)):
        return None
    p = _packer("d", len(v))
    return _pack_long(v, "d") if p is None else p(*v)


def _pack_mask(v: Any) -> bytes | None:
    if type(v) is not list or countOf(map(type, v), int) != len(v):
        return None
    try:
        b = bytes(v)
    except ValueError:  # outside 0..255
        return None
    return b if b.count(1) + b.count(0) == len(b) else None  # counted in C on the bytes


_PACK = {"i": _pack_ids, "d": _pack_logprobs, "b": _pack_mask}


def pack_array(values: Any, code: str) -> bytes | str:
    """The canonical form of one token array: packed little-endian bytes, or its JSON text.

    Packed (``code`` "i": int32, "d": float64, "b": 0/1 bytes) exactly when the array's JSON
    value is a list of JSON integers that fit ("i", "b") or of JSON floats ("d"), so the choice
    depends on the JSON value only (a tuple packs like a list; ``True`` is not ``1``; ``0`` is
    not ``0.0``) and unpacking gives back that value.

    Raises:
        ValueError: a non-finite float. TypeError: a value is not JSON-able.
    """
    packed = _PACK[code](values)
    if packed is not None:
        return packed
    text = _CANON.encode(plain(values))
    packed = _PACK[code](json.loads(text))  # tuples, int/float subclasses: as their JSON value
    return text if packed is None else packed


def unpack_array(data: bytes | memoryview, code: str) -> list[Any]:
    """Inverse of :func:`pack_array` for packed bytes."""
    if code == "b":
        return list(data)
    a = array(code)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def split_record(record: bytes) -> tuple[bytes, list[list[Any]]]:
    """Inverse of one turn's frames (:attr:`CanonicalTurn.record`).

    Returns:
        The turn's JSON without its token arrays (:attr:`CanonicalTurn.rest`, UTF-8), and the four
        arrays as values, in :data:`CANONICAL_ARRAYS` order.

    Raises:
        ValueError: the bytes are not one turn's frames.
    """
    try:
        return _split_packed(record) or _split_record(record)
    except struct.error as e:  # a header cut short
        raise ValueError(f"not a canonical turn record: {e}") from e


def _split_packed(record: bytes) -> tuple[bytes, list[list[Any]]] | None:
    """The usual record, all four arrays packed, read with two cached Structs (see _packed_record)."""
    size = len(record)
    tag, r = _HEADER(record, 0)
    p = 9 + r  # the output_ids frame
    if tag != b"t" or p + 9 > size:
        return None
    tag, k = _HEADER(record, p)
    n = k >> 2
    q = p + 27 + 13 * n  # the prompt_ids frame, if the three output frames are n long each
    if tag != b"i" or k & 3 or n > _STRUCT_MAX or q + 9 > size:
        return None
    tag, k = _HEADER(record, q)
    m = k >> 2
    if tag != b"i" or k & 3 or m > _STRUCT_MAX or q + 9 + k != size:
        return None
    out, prompt = _output_struct(n).unpack_from, _prompt_struct(m).unpack_from
    v = list(out(record, p))
    if v[n + 2] != b"d" or v[n + 3] != 8 * n or v[2 * n + 4] != b"b" or v[2 * n + 5] != n:
        return None
    return record[9:p], [v[2:n + 2], v[n + 4:2 * n + 4], v[2 * n + 6:], list(prompt(record, q)[2:])]


def _split_record(record: bytes) -> tuple[bytes, list[list[Any]]]:
    view = memoryview(record)  # array frames are read without a copy
    tag, n = _HEADER(record, 0)
    pos = rest_end = 9 + n
    if tag != b"t" or pos > len(record):
        raise ValueError("not a canonical turn record: it does not start with its 't' frame")
    arrays = []
    for code, packed in zip(ARRAY_CODES, _CODE_TAGS, strict=True):
        tag, n = _HEADER(record, pos)
        start, pos = pos + 9, pos + 9 + n
        if pos > len(record):
            raise ValueError(f"not a canonical turn record: a {tag!r} frame runs {pos - len(record)} bytes past its end")
        if tag == packed:
            arrays.append(unpack_array(view[start:pos], code))
        elif tag == b"j":
            arrays.append(json.loads(bytes(view[start:pos])))
        else:
            raise ValueError(f"not a canonical turn record: array frame tag {tag!r}")
    if pos != len(record):
        raise ValueError(f"not a canonical turn record: {len(record) - pos} bytes after its last frame")
    return record[9:rest_end], arrays


def array_json(a: bytes | str, code: str) -> str:
    """JSON text of an array in :func:`pack_array` form."""
    return a if type(a) is str else _CANON.encode(unpack_array(a, code))


def canonical_turns(ep: Episode) -> list[CanonicalTurn]:
    """The canonical pieces of every turn of ``ep``, in creation order.

    Raises:
        ValueError: a non-finite float. TypeError: a value is not JSON-able. KeyError: an unknown parent.
    """
    order = {t.turn_id: i for i, t in enumerate(ep.turns)}
    out = []
    esc, irepr, frepr, js, tc_js = encode_basestring_ascii, int.__repr__, float.__repr__, _json, _tool_call_json
    new_turn = partial(tuple.__new__, CanonicalTurn)  # CanonicalTurn(...) without its Python-level __new__
    n_odd = 0

    def odd(v: Any) -> str:  # a field not of its declared type: formatted all the same, and counted
        nonlocal n_odd
        n_odd += 1
        return js(v)

    for i, t in enumerate(ep.turns):
        n_odd = 0
        # Each field formatted inline for its usual type (str, int, bool, None, an empty dict or
        # list, a finite float) and through _json otherwise: the same text _CANON gives, without
        # a function call per field. The keys are spelled out: an f-string beats a join over them.
        v = t.action
        action = esc(v) if type(v) is str else "null" if v is None else odd(v)
        v = t.action_text
        action_text = esc(v) if type(v) is str else odd(v)
        v = t.error
        error = "null" if v is None else esc(v) if type(v) is str else odd(v)
        v = t.index
        index = irepr(v) if type(v) is int else odd(v)
        v = t.info
        info = ("{}" if not v else js(v)) if type(v) is dict else odd(v)
        v = t.media
        media = ("[]" if not v else js(v)) if type(v) is list else odd(v)
        v = t.observation
        obs = esc(v) if type(v) is str else odd(v)
        v = t.policy_version
        pv = irepr(v) if type(v) is int else odd(v)
        v = t.result
        result = esc(v) if type(v) is str else "null" if v is None else odd(v)
        v = t.reward
        reward = frepr(v) if type(v) is float and v - v == 0.0 else odd(v)  # finite: v - v is 0
        v = t.state_key
        state_key = "null" if v is None else esc(v) if type(v) is str else odd(v)
        v = t.tool_call
        tool = tc_js(v) if type(v) is ToolCall else "null" if v is None else odd(v)
        v = t.terminated
        term = "true" if v is True else "false" if v is False else odd(v)
        v = t.truncated
        trunc = "true" if v is True else "false" if v is False else odd(v)
        v = t.valid
        valid = "true" if v is True else "false" if v is False else odd(v)
        head = (f'"action":{action},"action_text":{action_text},"error":{error},"index":{index},"info":{info},'
                f'"media":{media},"observation":{obs}')
        parent = "null" if t.parent_id is None else order[t.parent_id]
        mid = f'"parent_id":{parent},"policy_version":{pv}'
        tail = (f'"result":{result},"reward":{reward},"state_key":{state_key},"terminated":{term},'
                f'"tool_call":{tool},"truncated":{trunc},"turn_id":{i},"valid":{valid}')
        rest = f"{{{head},{mid},{tail}}}"
        record = _packed_record(rest, t.output_ids, t.output_logprobs, t.output_mask, t.prompt_ids)
        # checked: declared types throughout, no NUL or surrogate escape in the text, storable arrays
        n = len(t.output_ids)
        lo = len(rest) + 27 + 4 * n  # the log-prob payload in the record; its high bytes: [lo + 7::8]
        checked = (n_odd == 0 and record is not None and "\\u" not in rest  # no escape: ASCII text, no NUL
                   and not record[lo + 7:lo + 8 * n:8].translate(None, _CLEAR_HIGH_BYTES))
        if record is None:  # not plain lists of exact values: the general rule decides, array by array
            record = _record(rest, (pack_array(t.output_ids, "i"), pack_array(t.output_logprobs, "d"),
                                    pack_array(t.output_mask, "b"), pack_array(t.prompt_ids, "i")))
        out.append(new_turn((head, mid, tail, rest, record, checked)))
    return out


def content_hash(ep: Episode, turns: list[CanonicalTurn] | None = None) -> str:
    """sha256 (hex) of the episode's content, independent of ids, timestamps and grouping.

    Two episodes with the same task, same turns (tokens, log-prob bits, masks, actions,
    results, rewards) and the same tree shape hash equal, whatever their ``episode_id``, turn
    ids, ``created_at``, ``group_id``, ``iteration``, ``tags``, ``metadata`` and turn
    ``timings``: the store uses this for deduplication. The ``origin`` of a branch or tree
    continuation is content (it decides which turns are trained), the trunk's episode id in it
    included. Any other change (one token id, one bit
    of one log-prob, one mask value, an action, a reward) changes the hash. The hashed bytes are
    :func:`canonical_episode`'s.

    Args:
        ep: The episode.
        turns: Its :func:`canonical_turns`, when the caller built them already (the store does).

    Raises:
        ValueError: a non-finite float. TypeError: a value is not JSON-able.
    """
    return hashlib.sha256(canonical_episode(ep, canonical_turns(ep) if turns is None else turns)).hexdigest()


def canonical_episode(ep: Episode, turns: list[CanonicalTurn]) -> bytes:
    """The bytes :func:`content_hash` hashes, from the turns' canonical pieces."""
    j = _json  # the fields of _HASHED_FIELDS in sorted order, as _CANON would write the dict of them
    head = (f'{{"origin":{j(ep.origin)},"policy_version":{j(ep.policy_version)},"rewards":{j(ep.rewards)},'
            f'"schema_version":{j(ep.schema_version)},"seed":{j(ep.seed)},"source":{j(ep.source)},'
            f'"stop_reason":{j(ep.stop_reason)},"task_id":{j(ep.task_id)},"task_type":{j(ep.task_type)}}}').encode()
    parts = [CONTENT_HASH_VERSION, _FRAME(b"e", len(head)), head]
    parts += [c.record for c in turns]
    return b"".join(parts)


_HASHED_FIELDS = tuple(f for f in EPISODE_FIELDS if f not in HASH_EXCLUDED)
_ORDER = [*_HEAD, *CANONICAL_ARRAYS[:3], "parent_id", "policy_version", "prompt_ids", *_TAIL, "turn_id", "valid"]
_HASHED_ORDER = ["origin", "policy_version", "rewards", "schema_version", "seed", "source", "stop_reason", "task_id", "task_type"]
if sorted(f for f in TURN_FIELDS if f != "timings") != _ORDER or sorted(_HASHED_FIELDS) != _HASHED_ORDER:
    raise ImportError("the canonical form above no longer covers the Turn/Episode fields; update it "
                      "(docs/trajectory.md: adding a Turn field)")
