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
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from operator import countOf, itemgetter
from typing import Any, Literal, get_args

from arborl.trajectory.values import (
    FLOAT_LIMIT,
    INT32_MAX,
    INT32_MIN,
    INT_MAX,
    INT_MIN,
    SchemaError,
    check_int,
    check_json,
    check_number,
    check_texts,
    check_token_arrays,
    number_problem,
    raise_type,
    text_problem,
)

SCHEMA_VERSION = 2
"""Bump when a field changes meaning; readers refuse versions newer than they know.

Version 2 added :attr:`Episode.origin`. A version-1 record kept its branch provenance in
``metadata["branch"]`` (and ``metadata["replayed_turns"]``); :func:`upgrade_record` reads it
into ``origin``, so old records train as they did.
"""

StopReason = Literal["", "terminated", "truncated", "max_turns", "max_context", "env_error"]
"""Why an episode ended (:attr:`Episode.stop_reason`), as the rollout engine writes it:

* ``"terminated"``: the environment reached a terminal state;
* ``"truncated"``: the environment cut the episode (its own step or time limit);
* ``"max_turns"``: the rollout's ``max_turns`` budget ran out;
* ``"max_context"``: the next turn would not fit the model's context (``max_context_tokens``);
* ``"env_error"``: the env, a tool or generation raised; the error text is on the episode
  (``metadata["error"]``) or its last turn (``Turn.error``);
* ``""``: not recorded (an episode built by hand, or still running).
"""
UNIX_TIME_MIN, UNIX_TIME_MAX = -62_135_596_800, 253_402_300_799
"""``Episode.created_at`` range: the unix times of 0001-01-01 and 9999-12-31 23:59:59 UTC (``datetime``'s)."""
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
"""The values of :data:`StopReason`; :meth:`Episode.validate` refuses any other."""


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


OriginKind = Literal["branch", "tree"]
"""How an episode grew out of another (:attr:`Origin.kind`):

* ``"branch"``: a forced action at a visited state, finished by the policy
  (:mod:`arborl.rollout.branch`); only the forced turn is credited;
* ``"tree"``: the policy re-sampled from a turn of another episode (:mod:`arborl.rollout.tree`);
  every turn from there on is its own.
"""
ORIGIN_KINDS: tuple[str, ...] = get_args(OriginKind)


@dataclass
class Origin:
    """Where an episode that continues another one comes from: a node of a rollout tree.

    The episode's path starts with its trunk's first ``turn`` turns (the same turns, same ids: a
    store keeps them once, in the trunk's record), and its own turns follow from path index
    ``turn`` on. Training reads the kind and the turn to decide what is credited, so the origin
    is part of the content hash.

    Attributes:
        of: Episode id of the trunk whose prefix this episode shares.
        turn: Path index of this episode's first own turn (= number of shared prefix turns).
        kind: ``"branch"`` or ``"tree"`` (see :data:`OriginKind`).
        action: The action text forced at ``turn`` (a branch), or ``None`` (a tree continuation).
        state_key: The anchor state the trunk recorded at ``turn``; a continuation that reaches
            another state diverged (an env not reproducible from its seed and actions).
    """

    of: str
    turn: int
    kind: OriginKind = "branch"
    action: str | None = None
    state_key: str | None = None

    def check(self, where: str) -> list[str]:
        """Raise :class:`SchemaError` on a malformed origin; returns its texts (checked by the caller)."""
        if type(self) is not Origin:
            raise SchemaError(f"{where}: origin must be an Origin or None, got {self!r}")
        if type(self.of) is not str or not self.of:
            raise SchemaError(f"{where}: origin.of must be the trunk's episode id (a non-empty string), got {self.of!r}")
        if type(self.turn) is not int or not 0 <= self.turn <= INT32_MAX:
            raise SchemaError(f"{where}: origin.turn must be a path index (an int >= 0), got {self.turn!r}")
        if self.kind not in ORIGIN_KINDS:
            raise SchemaError(f"{where}: origin.kind {self.kind!r} is not one of {list(ORIGIN_KINDS)}")
        texts = [self.of, self.kind]
        for name in ("action", "state_key"):
            v = getattr(self, name)
            if v is not None and type(v) is not str:
                raise SchemaError(f"{where}: origin.{name} must be a string or None, got {v!r}")
            if v is not None:
                texts.append(v)
        if self.kind == "branch" and self.action is None:
            raise SchemaError(f"{where}: a branch origin names its forced action (origin.action); use kind='tree' for "
                              "a re-sampled continuation")
        return texts


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
        """Raise :class:`SchemaError` naming the first field that is inconsistent or cannot be stored.

        Beyond the consistency rules (one log-prob and one mask value per output token, a finite
        reward), every value must be storable data as :mod:`arborl.trajectory.values` defines it,
        so that every store backend reads back exactly what was written.
        """
        check_texts(self._checked_texts(), f"turn {self.turn_id}")

    def _checked_texts(self, checked: bool = False) -> list[str]:
        """Check everything but the text content; return the texts to check (in one pass, by the caller).

        With ``checked``, the canonical encoder has proven the declared types, the token arrays
        and the texts it writes (:attr:`~arborl.trajectory.canonical.CanonicalTurn.checked`):
        what is left are the number ranges, the contents of the dicts, and the ids it replaced.
        """
        if checked:
            texts = [self.turn_id] if self.parent_id is None else [self.turn_id, self.parent_id]
            if countOf(map(type, texts), str) != len(texts):  # the ids are not in the encoder's text
                raise_type(self, ("turn_id", "parent_id"), str, f"turn {self.turn_id}", optional=True)
        else:
            values = tuple(self.__dict__.values())
            signature = tuple(map(type, values))  # the field types, checked once per distinct signature
            pick = _TEXTS_OF.get(signature)
            if pick is None:
                self._check_types()
                pick = _TEXTS_OF[signature] = itemgetter(*[k for k, t in enumerate(signature) if t is str])
            texts = [*pick(values)]
            check_token_arrays(self, f"turn {self.turn_id}")
        i, pv, r = self.index, self.policy_version, self.reward
        if not (INT_MIN <= i <= INT_MAX and INT_MIN <= pv <= INT_MAX):
            check_int(i, f"turn {self.turn_id}: index")
            check_int(pv, f"turn {self.turn_id}: policy_version")
        if not (-FLOAT_LIMIT < r < FLOAT_LIMIT and (r or math.copysign(1.0, r) > 0)):
            check_number(r, f"turn {self.turn_id}: reward (step rewards must be finite numbers)")
        if self.timings:
            check_json(self.timings, f"turn {self.turn_id}: timings")
        if self.info:
            check_json(self.info, f"turn {self.turn_id}: info")
        tc = self.tool_call
        if tc is not None:
            args = tc.arguments
            n = len(args) if type(args) is dict else -1
            if (type(tc.name) is str and tc.call_id is None and countOf(map(type, args), str) == n
                    and countOf(map(type, args.values()), str) == n):  # the usual call: flat str arguments
                if not checked:
                    texts.append(tc.name)
                    texts += args
                    texts += args.values()
            else:
                self._check_tool_call(f"turn {self.turn_id}", texts)
        if self.media:
            self._check_media(f"turn {self.turn_id}", texts)
        return texts

    def _check_types(self) -> None:
        """Each field of the type it declares (the slow path of :meth:`_checked_texts`, once per type signature)."""
        where = f"turn {self.turn_id}"
        raise_type(self, ("turn_id", "observation", "action_text"), str, where)
        raise_type(self, _TURN_OPTIONAL_TEXT, str, where, optional=True)
        raise_type(self, ("valid", "terminated", "truncated"), bool, where)
        raise_type(self, ("index", "policy_version"), int, where)
        raise_type(self, ("timings", "info"), dict, where)
        raise_type(self, ("media",), list, where)
        if type(self.reward) not in (int, float):
            raise SchemaError(f"{where}: reward must be a number, got {self.reward!r}")
        if self.tool_call is not None and type(self.tool_call) is not ToolCall:
            raise SchemaError(f"{where}: tool_call must be a ToolCall or None, got {self.tool_call!r}")

    def _check_media(self, where: str, texts: list[str]) -> None:
        """``media``: MediaRefs with str fields (their texts join ``texts``)."""
        for k, m in enumerate(self.media):
            if type(m) is not MediaRef or type(m.url) is not str or type(m.mime) is not str or (
                    m.sha256 is not None and type(m.sha256) is not str):
                raise SchemaError(f"{where}: media[{k}] must be a MediaRef with str url, mime and sha256 (or None), "
                                  f"got {m!r}")
            texts += (m.url, m.mime) if m.sha256 is None else (m.url, m.mime, m.sha256)

    def _check_tool_call(self, where: str, texts: list[str]) -> None:
        """``tool_call``: a str name and call_id (or None), storable arguments (texts join ``texts``)."""
        tc = self.tool_call
        if type(tc.name) is not str or (tc.call_id is not None and type(tc.call_id) is not str):
            raise SchemaError(f"{where}: tool_call must be a ToolCall with a str name and call_id (or None), got {tc!r}")
        args = tc.arguments
        if type(args) is not dict:
            raise SchemaError(f"{where}: tool_call.arguments must be a dict, got {type(args).__name__}")
        texts.append(tc.name)
        if tc.call_id is not None:
            texts.append(tc.call_id)
        if args:
            check_json(args, f"{where}: tool_call.arguments")


_TURN_OPTIONAL_TEXT = ("parent_id", "action", "result", "state_key", "error")
_TEXTS_OF: dict[tuple[type, ...], Callable[[tuple[Any, ...]], tuple[str, ...]]] = {}
"""Per type signature of a Turn's fields that passed :meth:`Turn._check_types`: which values are texts."""


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
        stop_reason: Why the episode ended: one of :data:`STOP_REASONS` (see :data:`StopReason`).
        policy_version: Version of the policy that generated the episode.
        iteration: Training iteration that produced it (-1 for synthetic/eval data).
        source: Which stage produced it: "synth", "rl", "eval", ...
        tags: Free-form labels for queries.
        created_at: Unix time of creation.
        metadata: JSON-able extras (env name, model path, ...).
        origin: Where the episode continues another one (a branch or a tree continuation), or
            ``None`` for an episode sampled from its start state; see :class:`Origin`.
        schema_version: Version of this schema the record was written with.
    """

    episode_id: str = field(default_factory=new_id)
    task_id: str = ""
    task_type: str = ""
    group_id: str = ""
    seed: int | None = None
    turns: list[Turn] = field(default_factory=list)
    rewards: dict[str, float | None] = field(default_factory=dict)
    stop_reason: StopReason = ""
    policy_version: int = 0
    iteration: int = -1
    source: str = ""
    tags: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)
    origin: Origin | None = None
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

    def validate(self, *, checked: Sequence[bool] | None = None) -> None:
        """Check the record; raise :class:`SchemaError` naming the field and the fix.

        Checks the types the fields declare, the tree (unique turn ids, parents before children),
        each turn (:meth:`Turn.validate`), and that every value is storable data as
        :mod:`arborl.trajectory.values` defines it (the same rules for every store backend).

        Args:
            checked: Per turn, whether the canonical encoder proved most of its rules in passing
                (:attr:`~arborl.trajectory.canonical.CanonicalTurn.checked`); the store passes it
                to skip those checks on its hot path.
        """
        eid = self.episode_id
        if type(eid) is not str or not eid:
            raise SchemaError(f"episode_id must be a non-empty string, got {eid!r}; give every episode a unique id")
        where = f"episode {eid}"
        sv = self.schema_version
        check_int(sv, f"{where}: schema_version")
        if sv > SCHEMA_VERSION:
            raise SchemaError(
                f"{where}: schema_version {sv} is newer than this arborl understands ({SCHEMA_VERSION}); "
                "upgrade arborl to read it")
        if sv < 1:
            raise SchemaError(f"{where}: schema_version {sv} is invalid")
        texts = [eid, self.task_id, self.task_type, self.group_id, self.source, self.stop_reason]
        if countOf(map(type, texts), str) != 6:
            raise_type(self, _EPISODE_TEXT, str, where)
        if self.stop_reason not in STOP_REASONS:
            raise SchemaError(f"{where}: stop_reason {self.stop_reason!r} is not one of {list(STOP_REASONS)}")
        self._check_values(where, texts)
        turns = self.turns
        if type(turns) is not list:
            raise SchemaError(f"{where}: turns must be a list of Turn, got {type(turns).__name__}")
        seen: set[str] = set()
        for k, t in enumerate(turns):
            if type(t) is not Turn:
                raise SchemaError(f"{where}: turns holds a {type(t).__name__}, not a Turn")
            if t.turn_id in seen:
                raise SchemaError(f"{where}: duplicate turn_id {t.turn_id}")
            if t.parent_id is not None and t.parent_id not in seen:
                raise SchemaError(
                    f"{where}: turn {t.turn_id} names parent {t.parent_id}, which does not precede it; "
                    "list parents before children")
            seen.add(t.turn_id)
            texts += t._checked_texts(checked is not None and checked[k])
        try:
            check_texts(texts, where)
        except SchemaError:
            self._raise_text_error(where)
            raise

    def _check_values(self, where: str, texts: list[str]) -> None:
        """The numeric fields, tags, rewards and metadata (texts are added to ``texts``)."""
        if self.seed is not None:
            check_int(self.seed, f"{where}: seed")
        for name in ("policy_version", "iteration"):  # 32-bit index columns
            check_int(getattr(self, name), f"{where}: {name}", INT32_MIN, INT32_MAX)
        check_number(self.created_at, f"{where}: created_at (a unix time)")
        if not UNIX_TIME_MIN <= self.created_at <= UNIX_TIME_MAX:  # time partitions and exports use datetime
            raise SchemaError(f"{where}: created_at = {self.created_at!r} is not a unix time of the years 1 to 9999 "
                              f"({UNIX_TIME_MIN}..{UNIX_TIME_MAX})")
        tags = self.tags
        if type(tags) is not list or countOf(map(type, tags), str) != len(tags):
            raise SchemaError(f"{where}: tags must be a list of strings, got {tags!r}")
        texts += tags
        rewards = self.rewards
        if type(rewards) is not dict:
            raise SchemaError(f"{where}: rewards must be a dict of name -> number or None, got {rewards!r}")
        for k, v in rewards.items():
            if type(k) is not str:
                raise SchemaError(f"{where}: rewards has the key {k!r}; reward names are strings")
            if v is not None and number_problem(v) is not None:
                raise SchemaError(f"{where}: rewards[{k!r}] = {v!r} {number_problem(v)}; use a finite number or "
                                  "None (not scored)")
            texts.append(k)
        if type(self.metadata) is not dict:
            raise SchemaError(f"{where}: metadata must be a dict, got {type(self.metadata).__name__}")
        if self.metadata:
            check_json(self.metadata, f"{where}: metadata")
        if self.origin is not None:
            texts += Origin.check(self.origin, where)  # unbound: a non-Origin is named, not an AttributeError

    def _raise_text_error(self, where: str) -> None:
        """Name the field of the first text that cannot be stored (the slow path of :meth:`validate`)."""
        named = [(name, getattr(self, name)) for name in _EPISODE_TEXT]
        named += [(f"tags[{k}]", v) for k, v in enumerate(self.tags)]
        named += [(f"rewards key {k!r}", k) for k in self.rewards]
        for t in self.turns:
            named += [(f"turn {t.turn_id}: {name}", getattr(t, name)) for name in _TURN_TEXT]
            named += [(f"turn {t.turn_id}: media[{k}].{a}", getattr(m, a)) for k, m in enumerate(t.media)
                      for a in ("url", "mime", "sha256")]
            if t.tool_call is not None:
                named += [(f"turn {t.turn_id}: tool_call.{a}", getattr(t.tool_call, a)) for a in ("name", "call_id")]
        if self.origin is not None:
            named += [(f"origin.{a}", getattr(self.origin, a)) for a in ("of", "action", "state_key")]
        for name, v in named:
            why = None if v is None else text_problem(v)
            if why is not None:
                raise SchemaError(f"{where}: {name} = {v!r:.60} {why}; remove or replace it before storing")

    # --- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (lossless), equal to ``dataclasses.asdict(self)``.

        Token lists are copied with ``list()`` and free-form extras only when non-empty, so the
        result shares no mutable object with the episode at a fraction of ``asdict``'s cost.
        """
        d = {name: plain(getattr(self, name)) for name in EPISODE_FIELDS}
        d["turns"] = [{name: plain(getattr(t, name)) for name in TURN_FIELDS} for t in self.turns]
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
        d = upgrade_record(d)
        _check_keys(d, cls, "episode")
        origin = d.get("origin")
        if origin is not None:
            if not isinstance(origin, dict):
                raise SchemaError(f"episode origin must be an object or null, got {type(origin).__name__}")
            _check_keys(origin, Origin, "episode origin")
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
        fields_ = {k: v for k, v in d.items() if k != "turns"}
        if origin is not None:
            fields_["origin"] = Origin(**origin)
        return cls(turns=turns, **fields_)

    @classmethod
    def from_json(cls, text: str | bytes) -> Episode:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))


def upgrade_record(d: dict[str, Any]) -> dict[str, Any]:
    """An episode dict of an older schema version in the current layout (a new dict; ``d`` is kept).

    Version 1 kept branch provenance in ``metadata["branch"] = {"of", "turn", "action",
    "state_key"}``; it becomes ``origin`` (kind ``"branch"``). The record keeps its version and
    its metadata, so its stored content hash still describes it.
    """
    if d.get("schema_version") != 1 or d.get("origin") is not None:
        return d
    meta = d.get("metadata")
    info = meta.get("branch") if isinstance(meta, dict) else None
    if not isinstance(info, dict):
        return d
    try:
        origin = {"of": str(info["of"]), "turn": int(info["turn"]), "kind": "branch",
                  "action": None if info.get("action") is None else str(info["action"]),
                  "state_key": None if info.get("state_key") is None else str(info["state_key"])}
    except (KeyError, TypeError, ValueError) as e:
        raise SchemaError(f"version-1 record has a malformed metadata['branch'] ({e}); it needs 'of' and 'turn'") from e
    return {**d, "origin": origin}


_SCALARS = frozenset((str, int, float, bool, type(None)))


def plain(v: Any) -> Any:
    """``dataclasses.asdict``'s conversion of one value: containers copied, dataclasses as dicts."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is list:
        return list(v) if _SCALARS.issuperset(map(type, v)) else [plain(x) for x in v]
    if t is ToolCall:
        return {"name": v.name, "arguments": plain(v.arguments), "call_id": v.call_id}
    if t is Origin:
        return {"of": v.of, "turn": v.turn, "kind": v.kind, "action": v.action, "state_key": v.state_key}
    if t is dict:
        return {k: plain(x) for k, x in v.items()}
    if is_dataclass(v) and not isinstance(v, type):
        return asdict(v)
    return tuple(plain(x) for x in v) if t is tuple else copy.deepcopy(v)  # anything else: as asdict does


def _check_keys(d: dict[str, Any], cls: type, where: str) -> None:
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise SchemaError(f"{where} has unknown field(s) {sorted(unknown)}; known fields are {sorted(known)}")
    missing = {f.name for f in fields(cls) if f.name in ("turn_id",)} - set(d)
    if missing:
        raise SchemaError(f"{where} is missing field(s) {sorted(missing)}")


TURN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Turn))
"""The fields of :class:`Turn`, in declaration order (see docs/trajectory.md before adding one)."""
EPISODE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Episode) if f.name != "turns")
"""The fields of :class:`Episode` other than ``turns``, in declaration order."""
_EPISODE_TEXT = ("episode_id", "task_id", "task_type", "group_id", "source", "stop_reason")
_TURN_TEXT = ("turn_id", "observation", "action_text", *_TURN_OPTIONAL_TEXT)


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
