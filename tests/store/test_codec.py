"""The store's codec: its content hash equals Episode.content_hash, and packed token arrays read
back exactly (equal values, equal types, equal hash) or are not packed at all."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storekit import make_episode

from arborl.store import open_store
from arborl.store.codec import prepare
from arborl.store.packing import pack_arrays, unpack_into
from arborl.trajectory.schema import Episode, MediaRef, Turn


def test_content_hash_matches_the_schema_for_trees_media_and_extras():
    eps = [make_episode(i, branch=(i % 2 == 0), n_turns=1 + i % 5) for i in range(12)]
    eps[1].turns[0].media = [MediaRef(url="file:///x.png", mime="image/png", sha256="ab")]
    eps[2].metadata = {"k": [1, {"z": 2}]}
    eps[3].turns[1].info = {"b": 1, "a": [1.5, None]}
    eps[4].turns[0].timings = {"env": 0.5}
    eps[5].rewards = {"success": None, "format": 0.5}
    eps.append(Episode(episode_id="empty", task_type="x"))
    for e in eps:
        assert prepare(e).row.content_hash == e.content_hash()


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
