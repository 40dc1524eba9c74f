"""The store's codec and the canonical form it shares with Episode.content_hash: hashes equal the
definition (computed here the slow way, independently: asdict form, ids renumbered, token arrays
packed with struct when their JSON value fits exactly), the pinned values, and change with every
content field but not with ids or timestamps; to_dict equals asdict without sharing lists, and
packed token arrays read back exactly (equal values, equal types, equal hash) or are not packed."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import math
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storekit import make_episode

from arborl.store import open_store
from arborl.store.codec import prepare
from arborl.trajectory.canonical import (
    CANONICAL_ARRAYS,
    canonical_turns,
    content_hash,
    pack_array,
    split_record,
    unpack_array,
)
from arborl.trajectory.schema import Episode, MediaRef, Origin, SchemaError, ToolCall, Turn


def _frame(tag: str, payload: bytes) -> bytes:
    return tag.encode() + struct.pack("<Q", len(payload)) + payload


def _array_frame(name: str, values: object) -> bytes:
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False)
    v = json.loads(text)
    if isinstance(v, list):
        n = len(v)
        if name == "output_logprobs" and all(type(x) is float for x in v):
            return _frame("d", struct.pack(f"<{n}d", *v))
        if name == "output_mask" and all(type(x) is int and x in (0, 1) for x in v):
            return _frame("b", struct.pack(f"<{n}b", *v))
        if name.endswith("_ids") and all(type(x) is int and -(2**31) <= x < 2**31 for x in v):
            return _frame("i", struct.pack(f"<{n}i", *v))
    return _frame("j", text.encode())


def reference_hash(ep: Episode) -> str:
    """The content hash by its definition (schema.py, canonical form), the slow way."""
    d = dataclasses.asdict(ep)
    order = {t["turn_id"]: i for i, t in enumerate(d["turns"])}
    for k in ("episode_id", "created_at", "group_id", "iteration", "tags", "metadata"):
        del d[k]
    turns = d.pop("turns")
    out = b"arborl-content-v3\n" + _frame("e", json.dumps(d, sort_keys=True, separators=(",", ":"),
                                                           allow_nan=False).encode())
    for t in turns:
        t["turn_id"], t["parent_id"] = order[t["turn_id"]], None if t["parent_id"] is None else order[t["parent_id"]]
        del t["timings"]
        arrays = {name: t.pop(name) for name in CANONICAL_ARRAYS}
        out += _frame("t", json.dumps(t, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())
        out += b"".join(_array_frame(name, arrays[name]) for name in CANONICAL_ARRAYS)
    return hashlib.sha256(out).hexdigest()


@dataclasses.dataclass
class _Extra:
    z: int
    a: tuple[int, ...]


def odd_episodes() -> list[Episode]:
    """Episodes that leave the fast paths: odd types, big ids, non-ASCII text, nested extras."""
    eps = [make_episode(i, branch=(i % 2 == 0), n_turns=2 + i % 4) for i in range(10)]
    eps[0].turns[0].prompt_ids = [-5, 2**40, 0, 1 << 17]  # outside int32 and the id text table
    eps[1].turns[0].output_logprobs = [0, -0.25]  # an int among the floats
    eps[2].turns[0].output_mask = [True, 1]  # a bool among the ints
    eps[3].turns[0].prompt_ids = (1, 2)  # a tuple, not a list
    eps[4].turns[0].observation, eps[4].turns[0].result = 'naïve ☃ "q"\n\u2028', "\x00"
    eps[5].turns[1].tool_call = ToolCall(name="f", arguments={"b": [1, {"y": 2, "x": None}], "a": 1.5}, call_id="c")
    eps[6].turns[0].info = {"extra": _Extra(1, (2, 3))}  # a dataclass inside free-form extras
    eps[7].turns[0].media = [MediaRef(url="file:///x.png", mime="image/png", sha256="ab")]
    eps[8].turns[0].reward, eps[8].turns[0].index = 3, 2**70  # an int reward, a huge index
    eps[9].rewards, eps[9].seed = {"success": None, "format": 0.5}, None
    eps[9].turns[0].timings, eps[9].metadata = {"env": 0.5}, {"k": [1, {"z": 2}]}
    return [*eps, Episode(episode_id="empty", task_type="x")]


UNSTORABLE = {"ep000003": "prompt_ids must be a list", "ep000004": "NUL", "ep000006": "info['extra'] is a _Extra",
              "ep000008": "index = 1180591620717411303424 is outside"}
"""The odd episodes that the store refuses (they would not read back exactly), with the reason."""


def test_content_hash_is_its_definition():
    # the hash is defined for any JSON-able content; the store hashes (and keeps) only what reads back exactly
    for ep in odd_episodes():
        assert content_hash(ep) == reference_hash(ep), ep.episode_id
        if ep.episode_id in UNSTORABLE:
            with pytest.raises(SchemaError, match=re.escape(UNSTORABLE[ep.episode_id])):
                prepare(ep)
        else:
            assert prepare(ep).row.content_hash == content_hash(ep), ep.episode_id


def test_content_hash_of_output_arrays_that_do_not_all_pack():
    # output arrays of one length go through one Struct together: each way that one of them may
    # not pack (mask values, an id outside int32, a float in the mask) must leave the hash as defined
    ep = Episode(episode_id="masks", task_type="x")
    for k, mask in enumerate(([2, 1], [-1, 0], [300, 1], [0, 1], [1.0, 1], [1, 1])):
        ep.add_turn(Turn(turn_id=f"m{k}", output_ids=[5, 2**31 if k == 5 else 6], output_logprobs=[-0.5, -1.0],
                         output_mask=mask))
    assert content_hash(ep) == reference_hash(ep)
    assert [isinstance(c.arrays[2], bytes) for c in canonical_turns(ep)] == [False, False, False, True, False, True]


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False,
                     allow_infinity=False), st.text(max_size=8))
json_value = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                            st.dictionaries(st.text(max_size=4), kids, max_size=10)),
                          max_leaves=12)
number = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False), st.booleans())


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=12), info=st.dictionaries(st.text(max_size=5), json_value, max_size=10),
       args=json_value, ids=st.lists(number, max_size=5), lps=st.lists(number, max_size=3),
       scalars=st.tuples(st.one_of(st.none(), st.text(max_size=5)), number, number), parent=st.booleans())
def test_content_hash_matches_the_definition_on_random_content(text, info, args, ids, lps, scalars, parent):
    action, reward, index = scalars
    t0 = Turn(turn_id="a", observation=text, info=info, prompt_ids=ids, action=action, reward=reward, index=index,
              tool_call=ToolCall(name=text, arguments={"x": args}), output_ids=list(ids[:len(lps)]),
              output_logprobs=lps, output_mask=[1] * len(lps), result=text, error=action)
    t1 = Turn(turn_id="b", parent_id="a" if parent else None, output_mask=ids, info={"v": args})
    ep = Episode(episode_id="e", task_id=text, rewards={text: None, "s": 0.5}, metadata={"m": args}, turns=[t0, t1])
    assert content_hash(ep) == reference_hash(ep)


def test_content_hash_values_are_pinned():
    # values of the v3 definition (v2 plus the episode's origin); a change here is a new definition
    # (bump CONTENT_HASH_VERSION)
    ep = make_episode(3, branch=True, n_turns=3)
    ep.turns[0].media = [MediaRef(url="file:///a.png", mime="image/png")]
    ep.turns[1].info = {"b": [1, 2.5, None], "a": "é"}
    assert content_hash(ep) == "c0e4d16ea8ac0f7d269e3a1d79a265684ef6ceb78f58bc7f9ba3937fe9136131"
    assert content_hash(make_episode(0)) == "ed0f6143ad9f8199b0941c9e39e767fc3ad69f700e10c4cf243bc9b7d0358612"
    tree = make_episode(0)
    tree.origin = Origin(of="ep9", turn=2, kind="tree", state_key="s")
    assert content_hash(tree) == "09c3ea5b42ecab9f9c981af00ff82af1cd450e09207355605ae3784dcb2c13bf"


def _variants(ep: Episode) -> list[tuple[str, Episode]]:
    """One changed content field (or one bit of one value) per copy of ``ep``."""
    out = []

    def change(name: str, fn: object) -> None:
        e = Episode.from_dict(ep.to_dict())
        fn(e)  # type: ignore[operator]
        out.append((name, e))

    lp = ep.turns[-1].output_logprobs[0]
    flipped = struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", lp))[0] ^ 1))[0]
    change("logprob bit", lambda e: e.turns[-1].output_logprobs.__setitem__(0, flipped))
    change("logprob -0.0", lambda e: e.turns[0].output_logprobs.__setitem__(0, -0.0))
    change("output id", lambda e: e.turns[0].output_ids.__setitem__(0, e.turns[0].output_ids[0] + 1))
    change("prompt id", lambda e: e.turns[-1].prompt_ids.__setitem__(-1, 8))
    change("prompt id appended", lambda e: e.turns[-1].prompt_ids.append(0))
    change("ids moved between arrays", lambda e: (e.turns[0].prompt_ids.append(e.turns[0].output_ids[0]),
                                                  e.turns[0].output_ids.pop(0), e.turns[0].output_logprobs.pop(0),
                                                  e.turns[0].output_mask.pop(0)))
    change("mask value", lambda e: e.turns[0].output_mask.__setitem__(0, 1 - e.turns[0].output_mask[0]))
    change("mask bool", lambda e: e.turns[0].output_mask.__setitem__(0, bool(e.turns[0].output_mask[0])))
    change("int logprob", lambda e: e.turns[0].output_logprobs.__setitem__(0, 0))
    change("action", lambda e: setattr(e.turns[0], "action", "other"))
    change("action_text", lambda e: setattr(e.turns[-1], "action_text", e.turns[-1].action_text + " "))
    change("observation", lambda e: setattr(e.turns[0], "observation", "x"))
    change("result", lambda e: setattr(e.turns[0], "result", ""))
    change("step reward", lambda e: setattr(e.turns[-1], "reward", e.turns[-1].reward + 1e-12))
    change("terminated", lambda e: setattr(e.turns[-1], "terminated", not e.turns[-1].terminated))
    change("valid", lambda e: setattr(e.turns[0], "valid", not e.turns[0].valid))
    change("info", lambda e: setattr(e.turns[0], "info", {"k": 1}))
    change("tool_call", lambda e: setattr(e.turns[0], "tool_call", ToolCall(name="f")))
    change("policy_version of a turn", lambda e: setattr(e.turns[0], "policy_version", 9))
    change("tree shape", lambda e: setattr(e.turns[-1], "parent_id", None))
    change("episode reward", lambda e: e.rewards.__setitem__("success", 0.25))
    change("task_id", lambda e: setattr(e, "task_id", "other"))
    change("seed", lambda e: setattr(e, "seed", 12345))
    change("stop_reason", lambda e: setattr(e, "stop_reason", "max_turns"))
    change("origin", lambda e: setattr(e, "origin", Origin(of="trunk", turn=1, kind="tree")))
    change("origin kind", lambda e: setattr(e, "origin", Origin(of="trunk", turn=1, kind="branch", action="a")))
    change("one turn more", lambda e: e.add_turn(Turn(turn_id="new", parent_id=e.turns[-1].turn_id)))
    return out


def test_any_changed_content_changes_the_hash():
    for ep in (make_episode(1), make_episode(4, branch=True)):
        hashes = {"original": content_hash(ep)}
        for name, e in _variants(ep):
            assert content_hash(e) == reference_hash(e), name
            if name == "logprob -0.0":  # hashed apart from 0.0, but not storable (PostgreSQL has no -0.0)
                with pytest.raises(SchemaError, match=r"output_logprobs\[0\] = -0.0"):
                    prepare(e)
            else:
                assert prepare(e).row.content_hash == content_hash(e), name
            hashes[name] = content_hash(e)
        assert len(set(hashes.values())) == len(hashes), hashes


def test_equal_content_hashes_equal_whatever_the_ids_and_timestamps():
    ep = make_episode(5, branch=True)
    other = Episode.from_dict(ep.to_dict())
    other.episode_id, other.created_at, other.group_id, other.iteration = "other", 1.0, "g9", 77
    other.tags, other.metadata = ["x"], {"run": 3}
    renamed = {t.turn_id: f"renamed-{i}" for i, t in enumerate(other.turns)}
    for t in other.turns:
        t.turn_id, t.parent_id = renamed[t.turn_id], None if t.parent_id is None else renamed[t.parent_id]
        t.timings = {"generate": 0.5}
    assert content_hash(other) == content_hash(ep) == prepare(other).row.content_hash
    other.turns[0].prompt_ids = tuple(other.turns[0].prompt_ids)  # same JSON value: a tuple packs like a list
    assert content_hash(other) == content_hash(ep)


def test_content_hash_refuses_non_finite_numbers_like_json():
    for bad in (math.nan, math.inf, -math.inf):
        ep = make_episode(1)
        ep.turns[1].output_logprobs = [-0.5, bad]
        with pytest.raises(ValueError, match="Out of range float"):
            content_hash(ep)


def test_canonical_text_is_the_sorted_json_and_packed_text_leaves_out_the_packed_arrays():
    for ep in odd_episodes():
        for c, t in zip(canonical_turns(ep), ep.turns, strict=True):
            full = json.loads(c.text())
            assert list(full) == sorted(full) and json.dumps(full, sort_keys=True, separators=(",", ":")) == c.text()
            assert all(full[n] == list(getattr(t, n)) for n in CANONICAL_ARRAYS)
            packed = json.loads(c.text(packed=True))
            left_out = {n for n, a in zip(CANONICAL_ARRAYS, c.arrays, strict=True) if isinstance(a, bytes)}
            assert packed == {k: v for k, v in full.items() if k not in left_out}
            assert json.loads(c.rest) == {k: v for k, v in full.items() if k not in CANONICAL_ARRAYS}


def test_to_dict_equals_asdict_and_shares_no_mutable_value():
    for ep in odd_episodes():
        d = ep.to_dict()
        assert d == dataclasses.asdict(ep)
        for t, td in zip(ep.turns, d["turns"], strict=True):
            for name in ("prompt_ids", "output_ids", "output_logprobs", "output_mask", "info", "media", "timings"):
                assert td[name] is not getattr(t, name) or isinstance(td[name], tuple)
        assert d["rewards"] is not ep.rewards and d["metadata"] is not ep.metadata
        if ep.episode_id != "ep000006":  # a dataclass in info comes back as a dict, as with asdict
            assert Episode.from_json(ep.to_json()).to_dict() == json.loads(json.dumps(d))


@pytest.mark.parametrize("enabled", [True, False])
def test_put_many_leaves_the_garbage_collector_as_it_found_it(sqlite_url, enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with open_store(sqlite_url) as store:
            store.put_many([make_episode(1), make_episode(2)])
            with pytest.raises(SchemaError, match=r"info\['x'\] is a object"):
                bad = make_episode(3)
                bad.turns[0].info = {"x": object()}
                store.put_many([bad])
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15).map(
    lambda x: x + 0.0)  # storable floats: below the jsonb limit, no -0.0 (x + 0.0 turns -0.0 into 0.0)


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=6),
       out=st.lists(st.tuples(st.integers(min_value=0, max_value=2**31 - 1), finite, st.sampled_from([0, 1])),
                    max_size=6),
       int_logprob=st.booleans())
def test_packed_turns_read_back_exactly(tmp_path_factory, prompt, out, int_logprob):
    ids = [o[0] for o in out]
    lps = [o[1] for o in out]
    if int_logprob and lps:
        lps[0] = 0  # an int among the floats: must stay JSON so its type (and the hash) survive
    t = Turn(turn_id="t0", prompt_ids=prompt, output_ids=ids, output_logprobs=lps, output_mask=[o[2] for o in out])
    ep = Episode(episode_id="e", task_type="x", turns=[t], created_at=1.0)
    path = tmp_path_factory.mktemp("p") / "t.db"
    with open_store(f"sqlite:///{path}") as store:
        store.put_many([ep])
        back = store.get("e")
        assert back == ep and content_hash(back) == content_hash(ep)
        assert [type(x) for x in back.turns[0].output_logprobs] == [type(x) for x in lps]
        assert store.slice("e", 0, 1)[0] == t


@pytest.mark.parametrize(
    ("field", "values", "packed"),
    [
        ("prompt_ids", [1, 2, 2**31 - 1], True),
        ("prompt_ids", [2**31], False),  # does not fit int32
        ("prompt_ids", [True, 2], False),  # a bool would come back as 1
        ("prompt_ids", [], True),
        ("output_logprobs", [-0.1, -1e-300, -math.pi], True),
        ("output_logprobs", [-1, -0.5], False),  # an int among floats
        ("output_mask", [0, 1, 1], True),
        ("output_mask", [1, True], False),
    ],
)
def test_pack_only_when_exact(field, values, packed):
    code = {"prompt_ids": "i", "output_logprobs": "d", "output_mask": "b"}[field]
    got = pack_array(values, code)
    assert isinstance(got, bytes) is packed
    back = unpack_array(got, code) if packed else json.loads(got)
    assert back == values and [type(v) for v in back] == [type(v) for v in values]


def test_split_record_gives_back_the_rest_and_the_arrays_and_refuses_other_bytes():
    for ep in odd_episodes():
        for c, t in zip(canonical_turns(ep), ep.turns, strict=True):
            rest, arrays = split_record(c.record)
            assert rest.decode() == c.rest
            want = [json.loads(json.dumps(list(getattr(t, n)))) for n in CANONICAL_ARRAYS]
            assert arrays == want and [list(map(type, a)) for a in arrays] == [list(map(type, a)) for a in want]
    record = canonical_turns(make_episode(1))[0].record
    for bad in (record[:-1], record + b"\0", record[:5], b"x" + record[1:], record.replace(b"d\x10", b"q\x10", 1)):
        with pytest.raises(ValueError, match="not a canonical turn record"):
            split_record(bad)
