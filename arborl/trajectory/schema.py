"""Typed, versioned trajectory records: an episode is a tree of turns.

An :class:`Episode` holds turns keyed by ``turn_id``; each :class:`Turn` names its ``parent_id``
(``None`` for a root). Episodes that branch from a shared prefix (tree search, re-rolls from a
state) share their ancestors instead of copying them. Training consumes a *linear view*: the
path from the root to one leaf (:meth:`Episode.path`), flattened by :func:`linearize`.

Token-in, token-out: every turn stores the exact token ids that were fed to the model
(``prompt_ids``: chat-template wrapping, observation, tool result; never trained on) and the
exact ids the model sampled (``output_ids``) with their behaviour log-probs. Text fields are for
people and for the environment; training never re-tokenizes them.

``None`` means "not scored" in ``Episode.rewards``; errors and the stop reason are fields, never
exceptions that kill the trainer.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import struct
import sys
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from json.encoder import encode_basestring_ascii
from operator import countOf
from typing import Any, NamedTuple

SCHEMA_VERSION = 1
"""Bump when a field changes meaning; readers refuse versions newer than they know."""


class SchemaError(ValueError):
    """A trajectory record is malformed; the message names the field and the fix."""


def new_id() -> str:
    """A fresh random id (uuid4 hex)."""
    return uuid.uuid4().hex


@dataclass
class MediaRef:
    """A reference to media (image, audio, file) kept outside the record, e.g. in a blob store.

    Attributes:
        url: Where the bytes live (``file://``, ``s3://``, ``blob://sha256/...``).
        mime: MIME type, e.g. ``image/png``.
        sha256: Content hash of the bytes, when known.
    """

    url: str
    mime: str = "application/octet-stream"
    sha256: str | None = None


@dataclass
class ToolCall:
    """A parsed tool call: tool name and JSON-able arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None


@dataclass
class Turn:
    """One step of an episode: what the model saw, what it wrote, and what happened next.

    Attributes:
        turn_id: Unique id within the episode.
        parent_id: Id of the previous turn on this branch; ``None`` for a root.
        index: Depth along the path (0 for a root): the step number.
        observation: Text of the observation the model acted on (for people; not trained on).
        media: Media shown with this observation, by reference.
        prompt_ids: Token ids fed to the model before it generated this turn (mask 0).
        output_ids: Token ids the model generated (including its end-of-turn token, if any).
        output_logprobs: Behaviour log-probs of ``output_ids`` under the sampling policy.
        output_mask: Per output token, 1 if trained on, 0 if not (e.g. a forced end token).
        action_text: Decoded model output for this turn.
        action: The parsed action given to the environment (``None`` if parsing failed).
        tool_call: The parsed tool call, if the action was one.
        valid: Whether the action parsed and was legal.
        result: The tool or environment result shown next (text), if any.
        state_key: Canonical string of the environment's anchor state *before* this action.
        reward: Step reward (environment reward plus any shaping/penalty applied in rollout).
        terminated: The environment reached a terminal state after this action.
        truncated: The episode was cut (step or token budget) after this action.
        error: Error text if the env/tool/sandbox call failed; the episode continued or stopped.
        timings: Seconds spent, e.g. ``{"generate": 0.01, "env": 0.001}``.
        policy_version: Version of the policy that sampled ``output_ids``.
        info: JSON-able extras from the environment.
    """

    turn_id: str
    parent_id: str | None = None
    index: int = 0
    observation: str = ""
    media: list[MediaRef] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_mask: list[int] = field(default_factory=list)
    action_text: str = ""
    action: str | None = None
    tool_call: ToolCall | None = None
    valid: bool = True
    result: str | None = None
    state_key: str | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise :class:`SchemaError` naming the first inconsistent field."""
        n = len(self.output_ids)
        if len(self.output_logprobs) != n:
            raise SchemaError(
                f"turn {self.turn_id}: output_logprobs has {len(self.output_logprobs)} entries but "
                f"output_ids has {n}; record one behaviour log-prob per generated token")
        if len(self.output_mask) != n:
            raise SchemaError(
                f"turn {self.turn_id}: output_mask has {len(self.output_mask)} entries but output_ids "
                f"has {n}; record one mask value (0/1) per generated token")
        if not math.isfinite(self.reward):
            raise SchemaError(f"turn {self.turn_id}: reward is {self.reward}; step rewards must be finite")
        s = sum(self.output_logprobs)  # C loops below; a finite sum means every value is finite
        if s - s != 0 and not all(map(math.isfinite, self.output_logprobs)):
            raise SchemaError(f"turn {self.turn_id}: output_logprobs contains a non-finite value")
        if countOf(self.output_mask, 0) + countOf(self.output_mask, 1) != len(self.output_mask):  # m in (0, 1)
            raise SchemaError(f"turn {self.turn_id}: output_mask values must be 0 or 1")


@dataclass
class Episode:
    """One task attempt: a tree of turns plus episode-level metadata.

    Attributes:
        episode_id: Unique id.
        task_id: Id of the task instance (e.g. map seed); episodes of one task share it.
        task_type: Capability bucket for queries ("frozenlake", "search", "code", ...).
        group_id: Rollout group (GRPO group): episodes compared with each other.
        seed: Environment seed used by ``reset``.
        turns: All turns of the tree, in creation order.
        rewards: Named episode scores; ``None`` means "not scored".
        stop_reason: Why the episode ended: "terminated", "max_turns", "max_tokens", "error", ...
        policy_version: Version of the policy that generated the episode.
        iteration: Training iteration that produced it (-1 for synthetic/eval data).
        source: Which stage produced it: "synth", "rl", "eval", ...
        tags: Free-form labels for queries.
        created_at: Unix time of creation.
        metadata: JSON-able extras (env name, model path, ...).
        schema_version: Version of this schema the record was written with.
    """

    episode_id: str = field(default_factory=new_id)
    task_id: str = ""
    task_type: str = ""
    group_id: str = ""
    seed: int | None = None
    turns: list[Turn] = field(default_factory=list)
    rewards: dict[str, float | None] = field(default_factory=dict)
    stop_reason: str = ""
    policy_version: int = 0
    iteration: int = -1
    source: str = ""
    tags: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # --- tree -------------------------------------------------------------------------------
    def add_turn(self, turn: Turn) -> Turn:
        """Append a turn; its parent must already be in the episode."""
        if turn.parent_id is not None and turn.parent_id not in self._by_id():
            raise SchemaError(f"turn {turn.turn_id}: parent_id {turn.parent_id} is not in the episode")
        self.turns.append(turn)
        return turn

    def _by_id(self) -> dict[str, Turn]:
        return {t.turn_id: t for t in self.turns}

    def children(self, turn_id: str | None) -> list[Turn]:
        """Turns whose parent is ``turn_id`` (``None`` gives the roots)."""
        return [t for t in self.turns if t.parent_id == turn_id]

    def leaves(self) -> list[Turn]:
        """Turns with no children, in creation order."""
        parents = {t.parent_id for t in self.turns}
        return [t for t in self.turns if t.turn_id not in parents]

    def path(self, leaf_id: str | None = None) -> list[Turn]:
        """Turns from the root to ``leaf_id`` (default: the most recently created leaf)."""
        if not self.turns:
            return []
        by_id = self._by_id()
        if leaf_id is None:
            leaf_id = self.leaves()[-1].turn_id
        if leaf_id not in by_id:
            raise KeyError(f"no turn {leaf_id!r} in episode {self.episode_id}")
        out: list[Turn] = []
        cur: str | None = leaf_id
        while cur is not None:
            t = by_id[cur]
            out.append(t)
            cur = t.parent_id
        return out[::-1]

    # --- scores -----------------------------------------------------------------------------
    @property
    def total_reward(self) -> float:
        """Sum of step rewards along the main path."""
        return float(sum(t.reward for t in self.path()))

    @property
    def success(self) -> bool | None:
        """``rewards["success"] > 0`` if scored, else ``None``."""
        s = self.rewards.get("success")
        return None if s is None else s > 0

    def validate(self) -> None:
        """Check the record; raise :class:`SchemaError` naming the field and the fix."""
        if self.schema_version > SCHEMA_VERSION:
            raise SchemaError(
                f"episode {self.episode_id}: schema_version {self.schema_version} is newer than this "
                f"arborl understands ({SCHEMA_VERSION}); upgrade arborl to read it")
        if self.schema_version < 1:
            raise SchemaError(f"episode {self.episode_id}: schema_version {self.schema_version} is invalid")
        if not self.episode_id:
            raise SchemaError("episode_id is empty; give every episode a unique id")
        if not isinstance(self.task_type, str):
            raise SchemaError(f"episode {self.episode_id}: task_type must be a string")
        for k, v in self.rewards.items():
            if v is not None and not math.isfinite(v):
                raise SchemaError(
                    f"episode {self.episode_id}: rewards[{k!r}] is {v}; use a finite number or None (not scored)")
        seen: set[str] = set()
        for t in self.turns:
            if t.turn_id in seen:
                raise SchemaError(f"episode {self.episode_id}: duplicate turn_id {t.turn_id}")
            if t.parent_id is not None and t.parent_id not in seen:
                raise SchemaError(
                    f"episode {self.episode_id}: turn {t.turn_id} names parent {t.parent_id}, which does "
                    "not precede it; list parents before children"
                )
            seen.add(t.turn_id)
            t.validate()

    # --- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (lossless), equal to ``dataclasses.asdict(self)``.

        Token lists are copied with ``list()`` and free-form extras only when non-empty, so the
        result shares no mutable object with the episode at a fraction of ``asdict``'s cost.
        """
        d = {name: _plain(getattr(self, name)) for name in _EPISODE_SCALARS}
        d["turns"] = [{name: _plain(getattr(t, name)) for name in _TURN_FIELDS} for t in self.turns]
        return d

    def to_json(self) -> str:
        """Compact JSON text (lossless round trip through :meth:`from_json`)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        """Inverse of :meth:`to_dict`; refuses newer schema versions and unknown fields."""
        if not isinstance(d, dict):
            raise SchemaError(f"an episode record must be a JSON object, got {type(d).__name__}")
        version = d.get("schema_version")
        if version is None:
            raise SchemaError("episode record has no schema_version; records must be written by arborl")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise SchemaError(
                f"episode record has schema_version {version!r}, newer than this arborl understands "
                f"({SCHEMA_VERSION}); upgrade arborl to read it")
        _check_keys(d, cls, "episode")
        turns = []
        for i, td in enumerate(d.get("turns", [])):
            if not isinstance(td, dict):
                raise SchemaError(f"turns[{i}] must be an object")
            _check_keys(td, Turn, f"turns[{i}]")
            if "turn_id" not in td:
                raise SchemaError(f"turns[{i}] has no turn_id")
            td = dict(td)
            td["media"] = [MediaRef(**m) for m in td.get("media", [])]
            tc = td.get("tool_call")
            td["tool_call"] = ToolCall(**tc) if tc is not None else None
            turns.append(Turn(**td))
        return cls(turns=turns, **{k: v for k, v in d.items() if k != "turns"})

    @classmethod
    def from_json(cls, text: str | bytes) -> Episode:
        return cls.from_dict(json.loads(text))

    def content_hash(self) -> str:
        """sha256 of the episode's content, independent of ids, timestamps and grouping.

        Two episodes with the same task, same turns (tokens, log-prob bits, masks, actions,
        results, rewards) and the same tree shape hash equal, whatever their ``episode_id``,
        turn ids, ``created_at``, ``group_id``, ``iteration``, ``tags``, ``metadata`` and turn
        ``timings``: the store uses this for deduplication. Any other change (one token id, one
        bit of one log-prob, one mask value, an action, a reward) changes the hash. The hashed
        bytes are :func:`canonical_episode` of :func:`canonical_turns`.
        """
        return hashlib.sha256(canonical_episode(self, canonical_turns(self))).hexdigest()


# --- canonical form (content hash) -----------------------------------------------------------
# canonical_episode() is a byte string of frames, each a tag byte, a little-endian uint64 length
# and that many bytes, so it parses back unambiguously (equal bytes <=> equal content):
#   b"arborl-content-v2\n"
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
# a JSON-only definition), and the store keeps the same bytes as its packed columns.
_CANON = json.JSONEncoder(separators=(",", ":"), allow_nan=False, sort_keys=True)
_SCALARS = frozenset((str, int, float, bool, type(None)))
HASH_EXCLUDED = frozenset({"episode_id", "created_at", "group_id", "iteration", "tags", "metadata"})
"""Episode fields that :meth:`Episode.content_hash` leaves out (ids, timestamps, grouping, labels)."""
CANONICAL_ARRAYS = ("output_ids", "output_logprobs", "output_mask", "prompt_ids")
"""Token array fields of a turn in canonical (sorted-key) order: :attr:`CanonicalTurn.arrays`."""
ARRAY_CODES = ("i", "d", "b", "i")
"""Packed code of each of :data:`CANONICAL_ARRAYS`: int32 ids, float64 log-probs, 0/1 mask bytes."""
CONTENT_HASH_VERSION = b"arborl-content-v2\n"
"""First bytes of :func:`canonical_episode`; a new definition gets a new version."""
_HEAD = ("action", "action_text", "error", "index", "info", "media", "observation")
_TAIL = ("result", "reward", "state_key", "terminated", "tool_call", "truncated")
_FRAME = struct.Struct("<cQ").pack
_CODE_TAGS = tuple(c.encode() for c in ARRAY_CODES)
_SCALAR_JSON: dict[type, Callable[[Any], str]] = {  # what _json gives for these exact types, in C
    str: encode_basestring_ascii, int: int.__repr__, bool: {True: "true", False: "false"}.__getitem__,
    type(None): {None: "null"}.__getitem__}
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
        arrays: Per :data:`CANONICAL_ARRAYS`: packed bytes (see :func:`pack_array`) or JSON text.
        record: The turn's frames of :func:`canonical_episode`.
    """

    head: str
    mid: str
    tail: str
    rest: str
    arrays: tuple[bytes | str, bytes | str, bytes | str, bytes | str]
    record: bytes

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


def _plain(v: Any) -> Any:
    """``dataclasses.asdict``'s conversion of one value: containers copied, dataclasses as dicts."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is list:
        return list(v) if _SCALARS.issuperset(map(type, v)) else [_plain(x) for x in v]
    if t is ToolCall:
        return {"name": v.name, "arguments": _plain(v.arguments), "call_id": v.call_id}
    if t is dict:
        return {k: _plain(x) for k, x in v.items()}
    if is_dataclass(v) and not isinstance(v, type):
        return asdict(v)
    return tuple(_plain(x) for x in v) if t is tuple else copy.deepcopy(v)  # anything else: as asdict does


def _json(v: Any) -> str:
    """``_CANON.encode(v)`` with the common scalar types formatted directly."""
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
        return "{" + ",".join([f"{encode_basestring_ascii(k)}:{_json(v[k])}" for k in sorted(v)]) + "}"
    if t is list and not v:
        return "[]"
    if t is ToolCall:
        return _tool_call_json(v)
    try:  # plain JSON data encodes as is; _plain converts what asdict would (dataclasses inside)
        return _CANON.encode(v)
    except TypeError:
        return _CANON.encode(_plain(v))


def _tool_call_json(v: ToolCall) -> str:
    """On most turns: its fields in sorted order, without building a dict."""
    return f'{{"arguments":{_json(v.arguments)},"call_id":{_json(v.call_id)},"name":{_json(v.name)}}}'


_SCALAR_JSON[ToolCall] = _tool_call_json


# Fast paths of pack_array: None unless the value is a list of exact-type values that fit.
# struct packs little-endian directly and is ~2.5x faster than array(...).tobytes() for short
# arrays; its Structs are cached per length up to _STRUCT_MAX (longer arrays go through array).
_STRUCT_MAX = 4096
_STRUCTS: dict[tuple[str, int], Callable[..., bytes]] = {}


def _packer(code: str, n: int) -> Callable[..., bytes] | None:
    if n > _STRUCT_MAX:
        return None
    p = _STRUCTS.get((code, n))
    if p is None:
        p = _STRUCTS[code, n] = struct.Struct(f"<{n}{code}").pack
    return p


def _pack_long(v: list[Any], code: str) -> bytes:
    a = array(code, v)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _pack_ids(v: Any) -> bytes | None:
    if type(v) is not list or countOf(map(type, v), int) != len(v):  # exact types: no bools
        return None
    p = _STRUCTS.get(("i", len(v))) or _packer("i", len(v))
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
    p = _STRUCTS.get(("d", len(v))) or _packer("d", len(v))
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
    text = _CANON.encode(_plain(values))
    packed = _PACK[code](json.loads(text))  # tuples, int/float subclasses: as their JSON value
    return text if packed is None else packed


def unpack_array(data: bytes, code: str) -> list[Any]:
    """Inverse of :func:`pack_array` for packed bytes."""
    if code == "b":
        return list(data)
    a = array(code)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a.tolist()


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
    get = _SCALAR_JSON.get
    for i, t in enumerate(ep.turns):
        # C encoders for the common types (str, int, bool, None), _json for the rest; the keys of
        # _HEAD / _TAIL spelled out: an f-string is ~2.5x faster than a join over them
        (action, action_text, error, index, info, media, obs, pv, result, reward, state_key, term, tool, trunc,
         valid) = [get(type(v), _json)(v) for v in (
             t.action, t.action_text, t.error, t.index, t.info, t.media, t.observation, t.policy_version,
             t.result, t.reward, t.state_key, t.terminated, t.tool_call, t.truncated, t.valid)]
        head = (f'"action":{action},"action_text":{action_text},"error":{error},"index":{index},"info":{info},'
                f'"media":{media},"observation":{obs}')
        parent = "null" if t.parent_id is None else str(order[t.parent_id])
        mid = f'"parent_id":{parent},"policy_version":{pv}'
        tail = (f'"result":{result},"reward":{reward},"state_key":{state_key},"terminated":{term},'
                f'"tool_call":{tool},"truncated":{trunc},"turn_id":{i},"valid":{valid}')
        arrays = (_pack_ids(t.output_ids), _pack_logprobs(t.output_logprobs), _pack_mask(t.output_mask),
                  _pack_ids(t.prompt_ids))
        if None in arrays:  # not a plain list of exact values: the general rule decides
            arrays = (pack_array(t.output_ids, "i"), pack_array(t.output_logprobs, "d"),
                      pack_array(t.output_mask, "b"), pack_array(t.prompt_ids, "i"))
        rest = f"{{{head},{mid},{tail}}}"
        out.append(CanonicalTurn(head, mid, tail, rest, arrays, _record(rest, arrays)))
    return out


def canonical_episode(ep: Episode, turns: list[CanonicalTurn]) -> bytes:
    """The bytes :meth:`Episode.content_hash` hashes, from the turns' canonical pieces."""
    head = _CANON.encode({f: _plain(getattr(ep, f)) for f in _HASHED_FIELDS}).encode()
    parts = [CONTENT_HASH_VERSION, _FRAME(b"e", len(head)), head]
    parts += [c.record for c in turns]
    return b"".join(parts)


def _check_keys(d: dict[str, Any], cls: type, where: str) -> None:
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise SchemaError(f"{where} has unknown field(s) {sorted(unknown)}; known fields are {sorted(known)}")
    missing = {f.name for f in fields(cls) if f.name in ("turn_id",)} - set(d)
    if missing:
        raise SchemaError(f"{where} is missing field(s) {sorted(missing)}")


_TURN_FIELDS = tuple(f.name for f in fields(Turn))
_EPISODE_SCALARS = tuple(f.name for f in fields(Episode) if f.name != "turns")
_HASHED_FIELDS = tuple(f for f in _EPISODE_SCALARS if f not in HASH_EXCLUDED)
_ORDER = [*_HEAD, *CANONICAL_ARRAYS[:3], "parent_id", "policy_version", "prompt_ids", *_TAIL, "turn_id", "valid"]
if sorted(f for f in _TURN_FIELDS if f != "timings") != _ORDER:
    raise ImportError("the canonical form above no longer covers the Turn/Episode fields; update it")


@dataclass
class LinearView:
    """The flattened token sequence of one root-to-leaf path, ready for a training forward pass.

    ``input_ids[i]`` is the i-th token of the conversation; ``loss_mask[i]`` is 1 only where the
    model generated the token and it is trained on; ``logprobs[i]`` is the behaviour log-prob
    of that token (0 where masked); ``turn_index[i]`` maps each token to its turn on the path.
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn_index: list[int]
    turns: list[Turn]


def linearize(episode: Episode, leaf_id: str | None = None) -> LinearView:
    """Flatten the path to ``leaf_id`` into one token sequence with its loss mask."""
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    tix: list[int] = []
    path = episode.path(leaf_id)
    for k, t in enumerate(path):
        ids += t.prompt_ids
        mask += [0] * len(t.prompt_ids)
        lps += [0.0] * len(t.prompt_ids)
        tix += [k] * len(t.prompt_ids)
        ids += t.output_ids
        mask += list(t.output_mask)
        lps += list(t.output_logprobs)
        tix += [k] * len(t.output_ids)
    return LinearView(ids, mask, lps, tix, path)
