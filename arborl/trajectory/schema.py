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
import time
import uuid
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from operator import countOf
from typing import Any

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
        bytes are :mod:`arborl.trajectory.canonical`'s ``canonical_episode``.
        """
        from arborl.trajectory.canonical import canonical_episode, canonical_turns  # it imports this module

        return hashlib.sha256(canonical_episode(self, canonical_turns(self))).hexdigest()


_SCALARS = frozenset((str, int, float, bool, type(None)))


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
