"""The viewer's JSON API over the hand-built store of conftest.py: every endpoint, bad parameters, a missing store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from arborl.store import StoreError
from arborl.view import data
from arborl.view.api import create_app

NEWEST_FIRST = ["long", "err", "tree", "a-br", "c", "b", "a"]


@pytest.fixture(scope="module")
def client(view_store, run_dir):
    with TestClient(create_app(view_store, [run_dir])) as c:
        yield c


def ids(resp) -> list[str]:
    assert resp.status_code == 200, resp.text
    return [e["episode_id"] for e in resp.json()["episodes"]]


def test_list_pages_newest_and_oldest_first_and_every_episode_once(client):
    assert ids(client.get("/api/episodes")) == NEWEST_FIRST
    assert ids(client.get("/api/episodes", params={"order": "oldest"})) == NEWEST_FIRST[::-1]
    for order, expect in (("newest", NEWEST_FIRST), ("oldest", NEWEST_FIRST[::-1])):
        seen, cursor = [], None
        while True:
            r = client.get("/api/episodes", params={"limit": 3, "order": order, **({"cursor": cursor} if cursor else {})})
            seen += ids(r)
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
        assert seen == expect  # pages of 3, 3, 1: each once, in order


def test_list_filters(client):
    assert ids(client.get("/api/episodes", params={"success": "false"})) == ["a-br", "c"]
    assert ids(client.get("/api/episodes", params={"min_reward": 0.5, "iteration": 1})) == ["tree", "b", "a"]
    assert ids(client.get("/api/episodes", params={"source": "rl-branch"})) == ["a-br"]
    assert ids(client.get("/api/episodes", params={"stop_reason": "env_error"})) == ["err"]
    assert ids(client.get("/api/episodes", params={"iteration": 2})) == ["long"]
    assert client.get("/api/count", params={"success": "true"}).json() == {"count": 4}


def test_stop_reason_filter_pages_in_the_backend(client):
    for order, expect in (("newest", NEWEST_FIRST), ("oldest", NEWEST_FIRST[::-1])):
        seen, cursor, pages = [], None, 0
        while True:
            r = client.get("/api/episodes", params={"stop_reason": "terminated", "limit": 2, "order": order,
                                                    **({"cursor": cursor} if cursor else {})})
            got = ids(r)
            assert len(got) == 2 or r.json()["next_cursor"] is None  # full pages until the last one
            seen += got
            pages += 1
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
        assert seen == [e for e in expect if e != "err"]
        assert pages == (len(seen) + 1) // 2


@pytest.mark.parametrize(("params", "words"), [
    ({"limit": "x"}, ["'limit'", "integer", "'x'"]),
    ({"limit": 0}, ["limit must be between 1 and 500"]),
    ({"limit": 501}, ["limit must be between 1 and 500"]),
    ({"success": "maybe"}, ["'success'", "boolean"]),
    ({"min_reward": "high"}, ["'min_reward'", "number"]),
    ({"order": "sideways"}, ["order must be 'newest' or 'oldest'"]),
    ({"cursor": "not-a-cursor"}, ["invalid cursor", "next_cursor"]),
])
def test_bad_list_parameters_are_400_naming_the_parameter(client, params, words):
    r = client.get("/api/episodes", params=params)
    assert r.status_code == 400
    msg = r.json()["error"]
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_bad_paths_and_other_endpoints(client):
    r = client.get("/api/episodes/nope")
    assert r.status_code == 404 and "no episode 'nope'" in r.json()["error"]
    assert client.get("/api/episodes/nope/group").status_code == 404
    r = client.get("/api/episodes/long/media/0/5")
    assert r.status_code == 400 and "no media 5 on turn 0" in r.json()["error"]
    assert client.get("/api/episodes/long/media/x/0").status_code == 400
    r = client.get("/api/profile", params={"group_by": "colour"})
    assert r.status_code == 400 and "cannot group by ['colour']" in r.json()["error"]
    r = client.get("/api/runs/3")
    assert r.status_code == 404 and "runs 0..0" in r.json()["error"]
    assert client.get("/api/nothing").status_code == 404


def test_episode_tree_branches_and_continuations(client):
    d = client.get("/api/episodes/tree").json()
    assert d["roots"] == ["tree-0"] and d["main_path"] == ["tree-0", "y"]
    by = {t["turn_id"]: t for t in d["turns"]}
    assert by["tree-0"]["children"] == ["x", "y"]
    assert (by["x"]["on_main_path"], by["y"]["on_main_path"]) == (False, True)
    a = client.get("/api/episodes/a").json()
    # a-br continues a from path index 1, i.e. after a's turn 0, with the forced action Up
    assert a["continuations"] == [{"episode_id": "a-br", "after_turn": "a-0", "turn": 1, "kind": "branch",
                                   "action": "Up", "reward": -0.5, "success": False, "n_turns": 2}]
    br = client.get("/api/episodes/a-br").json()
    assert br["main_path"] == ["a-0", "a-br-1"] and br["episode"]["origin"]["of"] == "a"


def test_episode_turn_details(client):
    d = client.get("/api/episodes/long").json()
    assert d["episode"]["n_turns"] == 20 and len(d["turns"]) == 20
    t0, t3 = d["turns"][0], d["turns"][3]
    assert t0["tokens"] == [{"id": 10, "text": None, "logprob": -0.1, "mask": 1},
                            {"id": 2, "text": None, "logprob": 0.0, "mask": 0}]
    assert t3["advantages"] == {"grpo": 0.5, "gigpo": -0.25} and "advantages" not in t3["info"]
    assert t0["timings"] == {"generate": 0.01, "env": 0.001} and t0["n_prompt_tokens"] == 3
    assert d["turns"][19]["reward"] == 1.0
    img = client.get("/api/episodes/long/media/0/0")
    assert img.status_code == 200 and img.headers["content-type"] == "image/png" and img.content.startswith(b"\x89PNG")
    e = client.get("/api/episodes/err").json()
    assert e["episode"]["error"] == "tool crashed" and e["episode"]["stop_reason"] == "env_error"
    assert e["turns"][0]["error"].startswith("ToolError") and e["turns"][0]["tool_call"]["name"] == "search"


def test_group_aligned_by_turn_with_first_divergence(client):
    g = client.get("/api/episodes/b/group").json()
    assert g["group_id"] == "g1"
    assert [e["episode_id"] for e in g["episodes"]] == ["a", "b", "c", "a-br"]  # oldest first
    # turn 0: Left everywhere; turn 1: Down, Down, Right, Up -> the first divergence is turn 1
    assert g["first_divergence"] == 1
    # s0 is visited by all four, s1 by a, b and a-br; the rest by one episode only
    assert g["anchors"] == {"s0": 0, "s1": 1}
    assert [t["action_text"] for t in g["episodes"][3]["turns"]] == ["Left", "Up"]


def test_first_divergence_by_hand():
    from arborl.trajectory.schema import Turn

    def path(*acts):
        return [Turn(turn_id=str(i), action_text=a) for i, a in enumerate(acts)]

    assert data.first_divergence([path("L", "D"), path("L", "D")]) is None
    assert data.first_divergence([path("L", "D"), path("L")]) == 1  # one ended
    assert data.first_divergence([path("L"), path("R")]) == 0
    assert data.first_divergence([path("L")]) is None


def test_profile_and_runs(client):
    p = client.get("/api/profile", params={"group_by": "iteration"}).json()
    assert p["group_by"] == ["iteration"]
    rows = {r["iteration"]: r for r in p["rows"]}
    assert rows[1]["count"] == 6 and rows[1]["n_scored"] == 5 and rows[1]["success_rate"] == pytest.approx(3 / 5)
    assert rows[2]["count"] == 1 and rows[2]["success_rate"] == 1.0
    r = client.get("/api/runs/0").json()
    assert [m["env_steps"] for m in r["metrics"]] == [10, 30, 50]  # the torn last line is skipped
    assert r["summary"]["rl_gain"] == 0.5
    info = client.get("/api/info").json()
    assert info["runs"][0]["k"] == 0 and info["decoded_tokens"] is False


def test_page_and_static_files_are_served(client):
    r = client.get("/")
    assert r.status_code == 200 and "/static/app.js" in r.text
    assert client.get("/static/app.js").status_code == 200


def test_never_writes_to_the_store(view_store, run_dir):
    path = Path(view_store.removeprefix("sqlite:///"))
    files = sorted(p for p in path.parent.rglob("*") if p.is_file())
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    with TestClient(create_app(view_store, [run_dir])) as c:
        for url in ("/api/episodes", "/api/count", "/api/episodes/a", "/api/episodes/a/group", "/api/profile",
                    "/api/episodes/long/media/0/0"):
            assert c.get(url).status_code == 200
        assert c.post("/api/episodes").status_code == 405  # no route takes a write
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(q for q in path.parent.rglob("*") if q.is_file())}
    assert after == before


def test_a_store_url_that_does_not_exist_is_refused_and_not_created(tmp_path, view_store):
    with pytest.raises(StoreError, match="missing.db"):
        create_app(f"sqlite:///{tmp_path}/missing.db")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="run directory"):
        create_app(view_store, [tmp_path / "norun"])


def test_list_pages_are_the_stores_own_pages(view_store):
    """Newest first without a stop-reason filter, a page and its cursor are exactly query_index's."""
    from arborl.store import open_store

    with open_store(view_store, read_only=True) as store:
        for f in ({}, {"success": True}, {"iteration": 1, "min_reward": 0.5}):
            cursor, ref_cursor = None, None
            while True:
                page = data.list_page(store, f, limit=2, cursor=cursor)
                rows, ref_cursor = store.query_index(limit=2, cursor=ref_cursor, **f)
                assert [e["episode_id"] for e in page["episodes"]] == [r.episode_id for r in rows]
                assert page["next_cursor"] == ref_cursor
                cursor = page["next_cursor"]
                if cursor is None:
                    break
