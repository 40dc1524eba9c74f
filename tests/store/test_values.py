"""One validation for every backend (issue 10, items 11 and 12): what a backend could not read back
exactly is refused with the same SchemaError before anything is written, and what is accepted
reads back exactly (equal values of equal types, equal content hash) on SQLite, PostgreSQL (plain
and partitioned) and Redis (file and S3 bodies)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storekit import make_episode

from arborl.store import open_store
from arborl.trajectory import content_hash
from arborl.trajectory.canonical import canonical_turns
from arborl.trajectory.schema import SchemaError


def _nested(depth: int) -> list:
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def _set(path: str, value: object):
    """A mutation of episode 99 that puts ``value`` at ``path`` (turn fields on turn t1)."""
    def mutate(ep):
        if path.startswith("turn."):
            setattr(ep.turns[1], path[5:], value)
        else:
            setattr(ep, path, value)
    return mutate


BAD = [
    # NUL characters: PostgreSQL text and jsonb cannot hold them (SQLite and Redis stored them)
    ("nul in observation", _set("turn.observation", "a\x00b"), "turn t1: observation = 'a\\x00b' contains a NUL"),
    ("nul in a tool result", _set("turn.result", "\x00"), "result"),
    ("nul in an info key", _set("turn.info", {"k\x00": 1}), "info key"),
    ("nul in metadata", _set("metadata", {"m": ["x\x00"]}), "metadata['m'][0]"),
    ("nul in task_type", _set("task_type", "a\x00"), "task_type"),
    # lone surrogates: no UTF-8 encoding
    ("lone surrogate", _set("turn.action_text", "ok \udc80"), "action_text"),
    ("lone surrogate in info", _set("turn.info", {"t": "\ud800"}), "info['t']"),
    # integers beyond 64 bits (Redis stored them, the others crashed)
    ("2**70 in info", _set("turn.info", {"big": 2**70}), "info['big'] = 1180591620717411303424 is outside"),
    ("2**70 seed", _set("seed", 2**70), "seed = 1180591620717411303424 is outside"),
    ("2**70 token id", _set("turn.prompt_ids", [1, 2**70]), "prompt_ids[1] = 1180591620717411303424 is outside"),
    ("2**40 policy_version", _set("policy_version", 2**40), "policy_version = 1099511627776 is outside"),
    # nesting that overflows JSON encoders (RecursionError before)
    ("depth 3000", _set("metadata", {"deep": _nested(3000)}), "nested more than 64 levels"),
    # lossy round trips
    ("int key", _set("turn.info", {1: 2}), "info has the key 1 (int)"),
    ("created_at 1e300", _set("created_at", 1e300), "created_at (a unix time) = 1e+300 has magnitude"),
    ("created_at in the year 47 million", _set("created_at", 1.5e15), "not a unix time of the years 1 to 9999"),
    ("float 1e16 in info", _set("turn.info", {"x": 1e16}), "info['x'] = 1e+16 has magnitude"),
    ("-0.0 log-prob", _set("turn.output_logprobs", [-0.5, -0.0]), "output_logprobs[1] = -0.0 is -0.0"),
    ("log-prob -1e17", _set("turn.output_logprobs", [-0.5, -1e17]), "output_logprobs[1] = -1e+17 has magnitude"),
    ("-0.0 reward", _set("turn.reward", -0.0), "reward"),
    ("tuple in info", _set("turn.info", {"pos": (1, 2)}), "info['pos'] is a tuple"),
    ("tuple of token ids", _set("turn.prompt_ids", (1, 2)), "prompt_ids must be a list"),
    ("unknown stop_reason", _set("stop_reason", "max_tokens"), "stop_reason 'max_tokens' is not one of"),
    ("bool as terminated flag", _set("turn.terminated", 1), "terminated must be a bool"),
]


@pytest.mark.parametrize(("name", "mutate", "message"), BAD, ids=[b[0] for b in BAD])
def test_unstorable_value_is_refused_alike_on_every_backend_before_any_write(store_url, name, mutate, message):
    bad = make_episode(99)
    mutate(bad)
    with open_store(store_url) as store:
        with pytest.raises(SchemaError) as err:
            store.put_many([make_episode(1), bad])
        assert message in str(err.value), str(err.value)
        assert "\n" not in str(err.value)
        assert store.count() == 0
        assert store.put_many([make_episode(1)]) == ["ep000001"]  # the store is still usable


def test_accepted_edge_values_read_back_exactly(store_url):
    ep = make_episode(7)
    ep.created_at = 253_402_300_799.0  # 9999-12-31 23:59:59 UTC, the last storable second
    ep.seed = -(2**63)
    ep.metadata = {"deep": _nested(60), "ints": [2**63 - 1, -(2**63), 0], "e": "é ☃ 😀", "z": 0.0}
    t = ep.turns[1]
    t.info = {"limit": 9007199254740992.0, "tiny": 5e-324, "neg": -1e-300, "one": 1.0, "int": 1, "b": [True, None]}
    t.observation = "naïve \u2028 😀 \\u0000 (an escaped NUL is fine)"
    t.prompt_ids = [2**40, -1, 2**63 - 1]  # beyond int32: kept as JSON, exactly
    t.output_ids, t.output_mask = [1, 2, 3], [1, 1, 0]
    t.output_logprobs = [0.0, -1e-300, -(2.0**50)]  # 2**50 is past the encoder's quick bound, below the limit
    with open_store(store_url) as store:
        store.put_many([ep])
        back = store.get(ep.episode_id)

    def text(e):  # equal JSON text means equal values *and* types (1 vs 1.0), whatever the key order
        return json.dumps(e.to_dict(), sort_keys=True)

    assert text(back) == text(ep)
    assert content_hash(back) == content_hash(ep)
    assert type(back.created_at) is float and back.turns[1].info["one"] == 1.0 and type(back.turns[1].info["one"]) is float


num = st.floats(allow_nan=False, allow_infinity=False)  # NaN and inf stop the encoder itself (not JSON)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), num, st.sampled_from([-0.0, 1e16, 2.0**49]),
                 st.text(max_size=6))
value = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=3), st.tuples(kids),
                                                  st.dictionaries(st.one_of(st.text(max_size=3), st.integers()),
                                                                  kids, max_size=3)), max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=8), info=st.dictionaries(st.text(max_size=4), value, max_size=4), reward=leaf,
       lps=st.lists(st.one_of(num, st.sampled_from([-0.0, -1e16, -(2.0**49), 0])), min_size=2, max_size=2),
       pv=st.integers(-(2**65), 2**65))
def test_the_encoders_shortcut_decides_as_the_full_validation(text, info, reward, lps, pv):
    # the store validates with what canonical_turns proved in passing; it must refuse exactly what
    # the full validation refuses, with the same message
    ep = make_episode(5)
    t = ep.turns[1]
    t.observation, t.info, t.reward, t.output_logprobs, t.policy_version = text, info, reward, lps, pv
    try:
        checked = [c.checked for c in canonical_turns(ep)]
    except (ValueError, TypeError):
        return  # not JSON-able at all: the store reports it through the full validation
    outcomes = []
    for kw in ({}, {"checked": checked}):
        try:
            ep.validate(**kw)
            outcomes.append(None)
        except SchemaError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
