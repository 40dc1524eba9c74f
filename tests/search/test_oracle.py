"""Oracle trajectories: Search-R1 tags, searches through the real server, the supporting passages retrieved."""

from __future__ import annotations

import re

import pytest

from arborl.search.client import SearchClient
from arborl.search.formats import Question
from arborl.search.oracle import oracle_actions, oracle_turns, transcript
from arborl.search.reward import exact_match, extract_answer
from arborl.search.server import RetrieverServer
from arborl.trajectory.schema import SchemaError


@pytest.fixture(scope="module")
def client(bm25):
    with RetrieverServer(bm25) as s:
        yield SearchClient(s.url, topk=3)


def test_oracle_turns_retrieve_the_supporting_passages_over_http(world, by_id, client):
    questions = world[1][:300]
    hits = total = 0
    for q in questions:
        turns = oracle_turns(q, client)
        assert len(turns) == q.hops + 1 and turns[-1].observation is None
        for hop, turn in enumerate(turns[:-1]):
            assert re.fullmatch(r"<think>[^<]+</think>\n<search>[^<]+</search>", turn.action)
            assert turn.action.endswith(f"<search>{q.oracle_queries[hop]}</search>")
            assert turn.observation.startswith("<information>Doc 1(Title: ") and turn.observation.endswith("</information>")
            total += 1
            hits += f'(Title: "{by_id[q.supporting_ids[hop]].title}")' in turn.observation
        if q.hops == 2:
            assert q.bridge_answers[0] in turns[0].observation  # what hop 1 read is what hop 2 searches with
            assert q.bridge_answers[0] in turns[1].action
        assert re.fullmatch(r"<think>[^<]+</think>\n<answer>[^<]+</answer>", turns[-1].action)
        assert exact_match(extract_answer(turns[-1].action), q.golden_answers) == 1.0
    assert hits / total >= 0.95


def test_transcript_interleaves_actions_and_information(world, client):
    q = next(q for q in world[1] if q.hops == 2)
    text = transcript(oracle_turns(q, client))
    assert [m.group(0) for m in re.finditer(r"</?(think|search|information|answer)>", text)] == [
        "<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
        "<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
        "<think>", "</think>", "<answer>", "</answer>"]
    assert extract_answer(text) == q.golden_answers[0]


def test_questions_without_oracle_queries_are_refused():
    with pytest.raises(SchemaError, match="no 'oracle_queries'"):
        oracle_turns(Question(id="u1", question="?", golden_answers=("x",)), lambda query: "")
    with pytest.raises(SchemaError, match="need 1 'bridge_answers'"):
        oracle_turns(Question(id="u2", question="?", golden_answers=("x",), oracle_queries=("a", "b")), lambda q: "")


def test_stop_early_answers_the_bridge_after_one_search_and_leaves_1_hop_questions_alone(world):
    two = next(q for q in world[1] if q.hops == 2)
    one = next(q for q in world[1] if q.hops == 1)
    assert oracle_actions(two, think=False, stop_early=True) == [
        f"<search>{two.oracle_queries[0]}</search>", f"<answer>{two.bridge_answers[0]}</answer>"]
    assert oracle_actions(one, think=False, stop_early=True) == oracle_actions(one, think=False)
    assert oracle_actions(two, stop_early=True)[-1] == (
        f"<think>The search shows the answer is {two.bridge_answers[0]}.</think>\n<answer>{two.bridge_answers[0]}</answer>")
