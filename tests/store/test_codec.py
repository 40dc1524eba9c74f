"""The store's codec and the canonical form it shares with Episode.content_hash: hashes equal the
definition (sorted-key JSON of the asdict form, ids renumbered) and the values of earlier
releases, to_dict equals asdict without sharing lists, and packed token arrays read back exactly
(equal values, equal types, equal hash) or are not packed at all."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storekit import make_episode

from arborl.store import open_store
from arborl.store.codec import prepare
from arborl.store.packing import pack_arrays, unpack_into
from arborl.trajectory.schema import CANONICAL_ARRAYS, Episode, MediaRef, ToolCall, Turn, canonical_turns


def reference_hash(ep: Episode) -> str:
    """The content hash by its definition, the slow way (the form earlier releases hashed)."""
    d = dataclasses.asdict(ep)
    order = {t["turn_id"]: i for i, t in enumerate(d["turns"])}
    for t in d["turns"]:
        t["turn_id"], t["parent_id"] = order[t["turn_id"]], None if t["parent_id"] is None else order[t["parent_id"]]
        del t["timings"]
    for k in ("episode_id", "created_at", "group_id", "iteration", "tags", "metadata"):
        del d[k]
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()).hexdigest()


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


def test_content_hash_is_the_canonical_json_of_the_asdict_form():
    for ep in odd_episodes():
        assert ep.content_hash() == reference_hash(ep) == prepare(ep).row.content_hash, ep.episode_id


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
    assert ep.content_hash() == reference_hash(ep)


def test_content_hash_values_are_those_of_earlier_releases():
    ep = make_episode(3, branch=True, n_turns=3)
    ep.turns[0].media = [MediaRef(url="file:///a.png", mime="image/png")]
    ep.turns[1].info = {"b": [1, 2.5, None], "a": "é"}
    assert ep.content_hash() == "07f6e1a4aa54f05c9dbe079125e50f9e86d506df793e65ae2a32a99765574717"
    assert make_episode(0).content_hash() == "479c269ea081e42fe312377ae47f0550c22247e8d58554d1391e9d652b42b341"


def test_content_hash_refuses_non_finite_numbers_like_json():
    for bad in (math.nan, math.inf, -math.inf):
        ep = make_episode(1)
        ep.turns[1].output_logprobs = [-0.5, bad]
        with pytest.raises(ValueError, match="Out of range float"):
            ep.content_hash()


def test_canonical_text_without_some_arrays_is_the_canonical_dict_without_them():
    ep = make_episode(2)
    for c in canonical_turns(ep):
        full = json.loads(c.text())
        assert list(full) == sorted(full) and json.dumps(full, sort_keys=True, separators=(",", ":")) == c.text()
        keep = (True, False, True, False)
        part = json.loads(c.text(keep))
        assert part == {k: v for k, v in full.items() if k not in ("output_logprobs", "prompt_ids")}
        assert json.loads(c.text((False,) * 4)).keys() == full.keys() - set(CANONICAL_ARRAYS)


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
            with pytest.raises(Exception, match="JSON-able"):
                bad = make_episode(3)
                bad.turns[0].info = {"x": object()}
                store.put_many([bad])
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


finite = st.floats(allow_nan=False, allow_infinity=False)


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
        assert back == ep and back.content_hash() == ep.content_hash()
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
    d = {"prompt_ids": [], "output_ids": [], "output_logprobs": [], "output_mask": [], "x": 1, field: values}
    rest, blobs = pack_arrays(d)
    assert (field not in rest) is packed
    assert rest["x"] == 1
    back = unpack_into(dict(rest), blobs)
    assert back[field] == values and [type(v) for v in back[field]] == [type(v) for v in values]
